"""Shared helpers of the text-to-speech unit tests: the tiny Orpheus model, random codec frames, a fake
talker and vocoder for the speech endpoint, and a decoder (FFmpeg's, through PyAV) for encoded audio.

Also the speech app's fixtures, shared by test_speech_serving.py and test_speech_formats.py: each is
defined under a `_fixture` name and registered by its `name`, so a module imports the definitions
(`from tests.unit.tts_support import speech_client_fixture  # noqa: F401`) and its tests take the
fixtures by their usual names.
"""

from __future__ import annotations

import asyncio
import io
import random
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast

import av
import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient
from starlette.responses import Response, StreamingResponse

from serve_app.codecs.orpheus import CODEBOOK_SIZE, FRAME_SIZE, OrpheusLayout
from serve_app.codecs.snac import SnacDecoder
from serve_app.config import AppArgs, parse_app_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import AudioChunk, ChoiceDelta, GenerateRequest, GenerationChunk, VocodeRequest
from serve_app.models.tiny_orpheus import ensure_tiny_orpheus_model
from serve_app.stages.tokenizer import TokenizerStage

REPO = Path(__file__).resolve().parents[2]


@cache
def tiny_orpheus_path() -> Path:
    """The tiny Orpheus model, built on first use (about 10 s) into the path the app's config names."""
    return ensure_tiny_orpheus_model(REPO / "models" / "tiny-orpheus")


def random_frames(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CODEBOOK_SIZE) for _ in range(FRAME_SIZE)] for _ in range(count)]


RATE = 24_000
# What a lossy encoder may add at the ends: its delay and the padding of its last frame, which nothing in a
# streamed file (no Xing/LAME header, no ADTS field) lets a decoder trim. Measured: MP3 64 ms, AAC 48 ms.
LOSSY_SLACK_S = 0.1
SAMPLES = 4  # per frame, in the fake vocoder
TTS: dict[str, Any] = {
    "codec": "unused", "voices": ["tara", "leo"], "max_input_chars": 200, "audio_s_per_char": 0.05,
    "max_audio_s": 20.0, "first_chunk_frames": 2, "chunk_frames": 3, "context_frames": 1,
    "max_chunks_in_flight": 2, "max_streams": 2, "max_waiting_streams": 0, "samples_per_frame": 2048,
}  # fmt: skip


class FakeTalker:
    """Emits `max_tokens` audio tokens (code k at step k), 5 per chunk, like a talker that never stops."""

    def __init__(self, layout: OrpheusLayout) -> None:
        self.layout = layout
        self.requests: list[GenerateRequest] = []
        self.closed = 0
        self.finish_reason = "length"  # of its last chunk: "stop" for a talker that ends on its own

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        total = request.sampling.max_tokens
        try:
            for start in range(0, total, 5):
                ids = [self.layout.audio_offset + (k % 7) * 4096 + k for k in range(start, min(start + 5, total))]
                last = start + 5 >= total
                yield GenerationChunk([ChoiceDelta(0, "", ids, self.finish_reason if last else None)], last)
                await asyncio.sleep(0)
        except GeneratorExit:
            self.closed += 1
            raise

    async def check_health(self) -> None:
        return None

    async def metrics_text(self) -> str:
        return ""


class FakeVocoder:
    """Audio of a frame = its first code, repeated SAMPLES times (`samples_per_frame`); records the calls
    in flight."""

    def __init__(self) -> None:
        self.samples_per_frame = SAMPLES
        self.requests: list[VocodeRequest] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.delay_s = 0.0
        self.error: BaseException | None = None

    async def decode(self, request: VocodeRequest) -> AudioChunk:
        self.requests.append(request)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.error is not None:
                raise self.error
            codes = [frame[0] for frame in request.frames[request.context :]]
            samples = np.repeat(np.array(codes, dtype="<i2"), self.samples_per_frame)
            return AudioChunk(samples.tobytes(), 0.001)
        finally:
            self.in_flight -= 1

    async def check_health(self) -> None:
        return None


def decode_audio(data: bytes) -> tuple[int, int, npt.NDArray[np.float32]]:
    """`data` as FFmpeg decodes it: the source's sample rate (for Opus, the one its OpusHead records:
    Opus always decodes at 48 kHz), the decoded rate, and the mono samples as floats in [-1, 1]."""
    # mode="r": a BytesIO reads without it, but only with it do av's stubs type the container as an input.
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        context = stream.codec_context
        assert context.layout.nb_channels == 1
        resampler = av.AudioResampler(format="flt", layout="mono")  # any sample format, same rate
        parts = [out.to_ndarray()[0] for frame in container.decode(stream) for out in resampler.resample(frame)]
        extradata = context.extradata or b""
        source_rate = (
            struct.unpack_from("<I", extradata, 12)[0] if extradata[:8] == b"OpusHead" else context.sample_rate
        )
        return source_rate, context.sample_rate, np.concatenate(parts) if parts else np.zeros(0, np.float32)


def audio_stream(response: Response) -> AsyncGenerator[bytes, None]:
    """The body of a streamed speech response (`create_speech` types it `Response`): the async generator
    of encoded audio its StreamingResponse sends, which a client going away closes."""
    assert isinstance(response, StreamingResponse)
    return cast(AsyncGenerator[bytes, None], response.body_iterator)


SPEECH = "/v1/audio/speech"
# What the fake talker emits for body()'s input: 1 s + 12 chars x 0.05 s = 1.6 s of audio at most, 19 frames
# of 2048 samples at 24 kHz, 7 tokens each, plus the token margin.
TOKENS = 19 * 7 + 16
FRAMES = TOKENS // 7


def body(**fields: Any) -> dict[str, Any]:
    """A `/v1/audio/speech` request body for the tiny Orpheus, with `fields` added or replaced."""
    return {"model": "tiny-orpheus", "input": "Hello there.", "voice": "tara"} | fields


def expected_codes(frames: int) -> list[int]:
    """The first code of each frame the fake talker emits: token k carries code k."""
    return [7 * f for f in range(frames)]


def speech_app_client(
    args: AppArgs, tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder, **tts: Any
) -> TestClient:
    """The speech app of `args`, with the `tts` config fields replaced."""
    assert args.tts is not None
    args = args.model_copy(update={"tts": args.tts.model_copy(update=tts)})
    return TestClient(create_app(Services.create(args, tokenizer, talker, vocoder=vocoder)))


@pytest.fixture(scope="module", name="decoder")
def decoder_fixture() -> SnacDecoder:
    """The tiny Orpheus's real SNAC decoder, on one thread."""
    return SnacDecoder(str(tiny_orpheus_path() / "snac"), threads=1)


@pytest.fixture(scope="module", name="speech_args")
def speech_args_fixture() -> AppArgs:
    model = {"path": str(tiny_orpheus_path()), "served_model_name": "tiny-orpheus", "max_model_len": 2048}
    return parse_app_args({"model": model, "tts": TTS})


@pytest.fixture(scope="module", name="speech_tokenizer")
def speech_tokenizer_fixture(speech_args: AppArgs) -> Iterator[TokenizerStage]:
    stage = TokenizerStage.from_args(speech_args)
    yield stage
    stage.close()


@pytest.fixture(name="talker")
def talker_fixture(speech_tokenizer: TokenizerStage) -> FakeTalker:
    assert speech_tokenizer.layout is not None
    return FakeTalker(speech_tokenizer.layout)


@pytest.fixture(name="vocoder")
def vocoder_fixture() -> FakeVocoder:
    return FakeVocoder()


@pytest.fixture(name="speech_services")
def speech_services_fixture(
    speech_args: AppArgs, speech_tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder
) -> Services:
    return Services.create(speech_args, speech_tokenizer, talker, vocoder=vocoder)


@pytest.fixture(name="speech_client")
def speech_client_fixture(speech_services: Services) -> TestClient:
    return TestClient(create_app(speech_services))
