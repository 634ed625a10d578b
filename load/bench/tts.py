"""The text-to-speech workload, shared by the bench (`--dataset tts`) and locust (`SpeechUser`).

Request `i` asks `POST /v1/audio/speech` to stream `--tts-input-chars` characters of text, built
from the seed and `i` alone, as raw 16-bit mono PCM (`response_format: pcm`); the sample rate comes
in the `X-Audio-Sample-Rate` response header. What is measured of the stream is in `metrics.py`.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from load.bench.client import RequestRecord, timed_post
from load.bench.datasets import WORDS, Prompt, positive_int
from load.bench.metrics import PCM_BYTES_PER_SAMPLE, UNDERRUN_THRESHOLD_MS

SPEECH_PATH = "/v1/audio/speech"
SAMPLE_RATE_HEADER = "X-Audio-Sample-Rate"
DEFAULT_VOICE = "tara"  # one of tiny-orpheus's (and Orpheus's) voices
DEFAULT_INPUT_CHARS = 120


def speech_text(rng: random.Random, chars: int) -> str:
    """Sentences of 5 to 12 words, cut at exactly `chars` characters (mid-word if it falls there)."""
    sentences: list[str] = []
    length = -1  # no space before the first sentence
    while length < chars:
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + ".")
        length += 1 + len(sentences[-1])
    return " ".join(sentences)[:chars]


@dataclass(frozen=True)
class SpeechDataset:
    """Prompt `i` has `chars` characters of text and the voice; the same `i` always gives the same text."""

    chars: int
    voice: str = DEFAULT_VOICE
    seed: int = 0

    @property
    def input_lens(self) -> tuple[int, ...]:
        """Characters, not tokens: the server's talker prompt adds its own."""
        return (self.chars,)

    def prompt(self, index: int) -> Prompt:
        # The output is as long as the model speaks it: no output length to ask for.
        return Prompt(speech_text(random.Random(f"{self.seed}:{index}"), self.chars), self.chars, 0, voice=self.voice)


def speech_body(model: str, prompt: Prompt) -> dict[str, Any]:
    return {"model": model, "input": prompt.text, "voice": prompt.voice, "response_format": "pcm", "stream": True}


def sample_rate(headers: Mapping[str, str]) -> int | None:
    value = headers.get(SAMPLE_RATE_HEADER, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass
class AudioStream:
    """What one streamed PCM response delivered so far: each non-empty read's arrival (seconds since the
    request was sent) and size in bytes. Reads, not the server's chunks: the network may merge or split
    those, and a player can only play what has arrived."""

    sample_rate: int | None
    times: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def feed(self, nbytes: int, elapsed_s: float) -> None:
        # An empty read has nothing to play: it neither ends TTFA nor has a time it is due.
        if nbytes:
            self.times.append(elapsed_s)
            self.sizes.append(nbytes)

    def failure(self) -> str | None:
        """Why the finished stream does not count as a successful request, or None."""
        if self.sample_rate is None:
            return f"no valid {SAMPLE_RATE_HEADER} header"
        if not self.times:
            return "no audio in stream"
        if sum(self.sizes) % PCM_BYTES_PER_SAMPLE:
            return f"{sum(self.sizes)} bytes of PCM: the stream ends mid-sample"
        return None

    def finish(self, record: RequestRecord) -> None:
        """Puts the audio into `record`, and why the stream failed if it did and nothing else failed before."""
        record.content_times, record.chunk_bytes, record.sample_rate = self.times, self.sizes, self.sample_rate
        if record.error is None and (failure := self.failure()) is not None:
            record.error = "stream"
            record.detail = failure


async def send(client: httpx.AsyncClient, base_url: str, model: str, prompt: Prompt) -> RequestRecord:
    body = speech_body(model, prompt)
    record = RequestRecord(sent_at=time.perf_counter(), input_len=prompt.input_len)
    audio = AudioStream(None)

    async def read(response: httpx.Response) -> None:
        audio.sample_rate = sample_rate(response.headers)
        async for data in response.aiter_bytes():
            audio.feed(len(data), time.perf_counter() - record.sent_at)

    await timed_post(client, base_url + SPEECH_PATH, body, record, read)
    audio.finish(record)
    return record


def milliseconds(value: str) -> float:
    if not float(value) >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected milliseconds, 0 or more, got {value}")
    return float(value)


def add_options(parser: Any) -> None:
    """The speech options, on the bench's command line and on locust's (an argparse parser either way)."""
    parser.add_argument(
        "--tts-input-chars", type=positive_int, default=DEFAULT_INPUT_CHARS, help="speech: characters of text a request"
    )
    parser.add_argument("--voice", default=DEFAULT_VOICE, help="speech: the voice to speak in")
    parser.add_argument(
        "--underrun-threshold-ms", type=milliseconds, default=UNDERRUN_THRESHOLD_MS,
        help="speech: a stream underruns when a chunk comes later than this after a real-time player needs it",
    )  # fmt: skip


def from_options(opts: Any, seed: int = 0) -> SpeechDataset:
    return SpeechDataset(opts.tts_input_chars, opts.voice, seed)
