"""Vocoder deployment: `VocoderStage` (the codec decoder) in its own replicas, scaled apart from the
talker's engine.

It is the stage class itself, as for the tokenizer.
"""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.stages.vocoder import VocoderStage


@serve.deployment(name="vocoder", max_ongoing_requests=8, max_queued_requests=64,
                  ray_actor_options={"num_cpus": 1})  # fmt: skip
class Vocoder(VocoderStage):
    def __init__(self, args: AppArgs) -> None:
        super().__init__(*VocoderStage.parts(args))

    def __del__(self) -> None:
        self.close()
