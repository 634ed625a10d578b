"""Vocoder deployment: `VocoderStage` (the codec decoder) in its own replicas, scaled apart from the
talker's engine."""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.messages import AudioChunk, VocodeRequest
from serve_app.stages.vocoder import VocoderStage


@serve.deployment(name="vocoder", max_ongoing_requests=8, max_queued_requests=64,
                  ray_actor_options={"num_cpus": 1})  # fmt: skip
class Vocoder:
    def __init__(self, args: AppArgs) -> None:
        self._stage = VocoderStage.from_args(args)

    async def decode(self, request: VocodeRequest) -> AudioChunk:
        return await self._stage.decode_async(request)

    async def ping(self) -> None:
        return None

    def __del__(self) -> None:
        self._stage.close()
