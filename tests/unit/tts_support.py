"""Shared helpers of the text-to-speech unit tests: the tiny Orpheus model, random codec frames, and a fake
talker and vocoder for the speech endpoint."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path

import numpy as np

from serve_app.codecs.orpheus import CODEBOOK_SIZE, FRAME_SIZE, OrpheusLayout
from serve_app.messages import AudioChunk, ChoiceDelta, GenerateRequest, GenerationChunk, VocodeRequest
from serve_app.models.tiny_orpheus import ensure_tiny_orpheus_model

REPO = Path(__file__).resolve().parents[2]


@cache
def tiny_orpheus_path() -> Path:
    """The tiny Orpheus model, built on first use (about 10 s) into the path the app's config names."""
    return ensure_tiny_orpheus_model(REPO / "models" / "tiny-orpheus")


def random_frames(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CODEBOOK_SIZE) for _ in range(FRAME_SIZE)] for _ in range(count)]


RATE = 24_000
SAMPLES = 4  # per frame, in the fake vocoder
TTS = {"codec": "unused", "voices": ["tara", "leo"], "max_input_chars": 200, "audio_s_per_char": 0.05,
       "max_audio_s": 20.0, "first_chunk_frames": 2, "chunk_frames": 3, "context_frames": 1,
       "max_chunks_in_flight": 2, "max_streams": 2, "max_waiting_streams": 0, "samples_per_frame": 2048}  # fmt: skip


class FakeTalker:
    """Emits `max_tokens` audio tokens (code k at step k), 5 per chunk, like a talker that never stops."""

    def __init__(self, layout: OrpheusLayout) -> None:
        self.layout = layout
        self.requests: list[GenerateRequest] = []
        self.closed = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        total = request.sampling.max_tokens
        try:
            for start in range(0, total, 5):
                ids = [self.layout.audio_offset + (k % 7) * 4096 + k for k in range(start, min(start + 5, total))]
                last = start + 5 >= total
                yield GenerationChunk([ChoiceDelta(0, "", ids, "length" if last else None)], 10, last)
                await asyncio.sleep(0)
        except GeneratorExit:
            self.closed += 1
            raise

    async def check_health(self) -> None:
        return None

    async def metrics_text(self) -> str:
        return ""


class FakeVocoder:
    """Audio of a frame = its first code, repeated SAMPLES times; records the calls in flight."""

    def __init__(self) -> None:
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
            samples = np.repeat(np.array(codes, dtype="<i2"), SAMPLES)
            return AudioChunk(samples.tobytes(), RATE, 0.001)
        finally:
            self.in_flight -= 1

    async def check_health(self) -> None:
        return None
