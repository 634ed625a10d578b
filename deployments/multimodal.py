"""Multimodal deployment: `MultimodalStage` in its own replicas, scaled apart from the engine."""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.messages import ImagesRequest, ProcessedImages
from serve_app.stages.multimodal import MultimodalStage


@serve.deployment(name="multimodal", max_ongoing_requests=32, max_queued_requests=128,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
class Multimodal:
    def __init__(self, args: AppArgs) -> None:
        self._stage = MultimodalStage.from_args(args)

    async def process(self, request: ImagesRequest) -> ProcessedImages:
        return await self._stage.process(request)

    async def ping(self) -> None:
        return None

    async def __del__(self) -> None:
        await self._stage.close()
