"""Multimodal deployment: `MultimodalStage` in its own replicas, scaled apart from the engine.

Its methods are the in-process client's (`LocalMultimodal`), as for the tokenizer.
"""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.stages.local import LocalMultimodal
from serve_app.stages.multimodal import MultimodalStage


@serve.deployment(name="multimodal", max_ongoing_requests=32, max_queued_requests=128,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
class Multimodal(LocalMultimodal):
    def __init__(self, args: AppArgs) -> None:
        super().__init__(MultimodalStage.from_args(args))

    async def __del__(self) -> None:
        await self._stage.close()
