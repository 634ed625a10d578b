"""Vocoder deployment: `VocoderStage` (the codec decoder) in its own replicas, scaled apart from the
talker's engine. Decoding runs in one worker thread per replica (torch releases the GIL), so the
replica's event loop keeps answering while a chunk decodes; more throughput means more replicas."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ray import serve

from serve_app.config import AppArgs
from serve_app.messages import AudioChunk, VocodeRequest
from serve_app.stages.vocoder import VocoderStage


@serve.deployment(name="vocoder", max_ongoing_requests=8, max_queued_requests=64,
                  ray_actor_options={"num_cpus": 1})  # fmt: skip
class Vocoder:
    def __init__(self, args: AppArgs) -> None:
        if args.tts is None:
            raise ValueError("the vocoder needs a `tts` block in the app args")
        self._stage = VocoderStage.from_path(args.tts.codec, args.tts.codec_threads)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vocoder")

    async def decode(self, request: VocodeRequest) -> AudioChunk:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._stage.decode, request)

    async def ping(self) -> None:
        return None

    def __del__(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
