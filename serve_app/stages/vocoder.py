"""Vocoder stage: codec frames to 16-bit PCM, in its own deployment.

Decoding is the TTS path's CPU-heavy step (a SNAC frame costs tens of milliseconds on a core), so it
runs apart from the ingress and the talker and scales by replicas. `decode` runs the
synchronous `decode_sync` in the stage's one worker thread (torch decodes outside the GIL), so the caller's
event loop keeps answering health checks; more throughput means more replicas, not threads.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from serve_app.audio_formats import pcm16
from serve_app.codecs.snac import CodecDecoder, SnacDecoder
from serve_app.config import AppArgs
from serve_app.errors import BadRequestError, DeadlineExceededError
from serve_app.messages import AudioChunk, VocodeRequest


class VocoderStage:
    def __init__(self, decoder: CodecDecoder) -> None:
        self._decoder = decoder
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vocoder")

    @staticmethod
    def parts(args: AppArgs) -> tuple[CodecDecoder]:
        """The constructor's arguments for `args`."""
        if args.tts is None:
            raise ValueError("the vocoder stage needs a `tts` block in the app args")
        decoder = SnacDecoder(args.tts.codec, args.tts.codec_threads)
        # The ingress sizes requests and labels audio with these before any chunk comes back.
        if (decoder.sample_rate, decoder.samples_per_frame) != (args.tts.sample_rate, args.tts.samples_per_frame):
            raise ValueError(
                f"codec {args.tts.codec} makes {decoder.samples_per_frame} samples per frame at "
                f"{decoder.sample_rate} Hz; tts.sample_rate and tts.samples_per_frame say "
                f"{args.tts.samples_per_frame} at {args.tts.sample_rate} Hz"
            )
        return (decoder,)

    @classmethod
    def from_args(cls, args: AppArgs) -> VocoderStage:
        return cls(*cls.parts(args))

    # `decode` and `check_health` are the `VocoderClient` methods: what the ingress calls, in-process or
    # through the deployment (which is this class).
    async def decode(self, request: VocodeRequest) -> AudioChunk:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.decode_sync, request)

    async def check_health(self) -> None:
        return None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _validate(self, request: VocodeRequest) -> None:
        """Raise BadRequestError unless the decoder can take `request` (DeadlineExceededError when its
        deadline passed while it waited for the worker thread)."""
        DeadlineExceededError.check(request.deadline, "vocoder")
        if not 0 <= request.context < len(request.frames):
            raise BadRequestError(
                f"A vocode request needs new frames after its {request.context} context frames; "
                f"it has {len(request.frames)} frames in all.",
                param="frames",
            )
        size, codebook = self._decoder.frame_size, self._decoder.codebook_size
        for i, frame in enumerate(request.frames):
            if len(frame) != size:
                raise BadRequestError(f"frames[{i}] has {len(frame)} codes; a frame has {size}.", param="frames")
            if not all(0 <= code < codebook for code in frame):
                raise BadRequestError(f"frames[{i}] has a code outside [0, {codebook}).", param="frames")

    def decode_sync(self, request: VocodeRequest) -> AudioChunk:
        start = time.perf_counter()
        self._validate(request)
        [audio] = self._decoder.decode([request])
        return AudioChunk(pcm16(audio), time.perf_counter() - start)
