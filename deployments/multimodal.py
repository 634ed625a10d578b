"""Multimodal deployment: `MultimodalStage` in its own replicas, scaled apart from the engine.

It is the stage class itself, as for the tokenizer.
"""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.stages.multimodal import MultimodalStage


@serve.deployment(name="multimodal", max_ongoing_requests=32, max_queued_requests=128,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
class Multimodal(MultimodalStage):
    def __init__(self, args: AppArgs) -> None:
        super().__init__(*MultimodalStage.parts(args))

    async def __del__(self) -> None:
        await self.close()
