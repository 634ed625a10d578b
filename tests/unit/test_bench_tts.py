"""The speech workload: its text, and one streamed request against fake transports with known timing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from load.bench import metrics, tts
from load.bench.datasets import WORDS

RATE = 8000  # 16,000 bytes a second: 800 bytes are 50 ms of audio


def test_text_is_deterministic_and_exactly_as_long_as_asked() -> None:
    dataset = tts.SpeechDataset(120, "leah", seed=3)
    prompt = dataset.prompt(7)
    assert (len(prompt.text), prompt.input_len, prompt.voice) == (120, 120, "leah")
    assert prompt == tts.SpeechDataset(120, "leah", seed=3).prompt(7)
    assert prompt.text != dataset.prompt(8).text != tts.SpeechDataset(120, "leah", seed=4).prompt(7).text
    assert prompt.text[0].isupper() and "." in prompt.text
    # Every word but the last (which the cut may shorten) is from the word list.
    assert {w.strip(".").lower() for w in prompt.text.split()[:-1]} <= set(WORDS)
    assert dataset.input_lens == (120,)
    assert len(tts.SpeechDataset(1).prompt(0).text) == 1


def test_audio_stream_ignores_empty_reads_and_checks_the_pcm() -> None:
    audio = tts.AudioStream(RATE)
    audio.feed(0, 0.1)  # headers flushed, or a keep-alive: no audio yet
    audio.feed(800, 0.25)
    audio.feed(0, 0.3)
    audio.feed(801, 0.4)
    assert (audio.times, audio.sizes) == ([0.25, 0.4], [800, 801])
    assert audio.failure() == "1601 bytes of PCM: the stream ends mid-sample"
    assert tts.AudioStream(RATE).failure() == "no audio in stream"
    assert tts.AudioStream(None).failure() == "no valid X-Audio-Sample-Rate header"
    assert tts.sample_rate({"X-Audio-Sample-Rate": "24000"}) == 24000
    assert tts.sample_rate({"X-Audio-Sample-Rate": "0"}) is tts.sample_rate({}) is None


Sent = list[tuple[str, object]]


def transport(
    status: int, headers: dict[str, str], schedule: list[tuple[float, bytes]], sent: Sent | None = None
) -> httpx.MockTransport:
    """Answers with `schedule`'s chunks, each after its delay; the requests' paths and JSON go to `sent`."""

    async def body() -> AsyncIterator[bytes]:
        for delay, chunk in schedule:
            await asyncio.sleep(delay)
            yield chunk

    async def handler(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append((request.url.path, json.loads(request.content)))
        return httpx.Response(status, headers=headers, content=body())

    return httpx.MockTransport(handler)


async def test_streamed_speech_is_timed_per_chunk() -> None:
    headers = {"X-Audio-Sample-Rate": str(RATE), "X-Tokenizer-Time": "1.5", "X-Vocoder-First-Chunk-Time": "2.5"}
    # 50 ms of audio at ~0.1 s, then a chunk 0.25 s later: due at ~0.15 s, late by ~0.2 s.
    schedule = [(0.02, b""), (0.08, bytes(800)), (0.25, bytes(800)), (0.0, bytes(1600))]
    sent: Sent = []
    prompt = tts.SpeechDataset(40).prompt(0)
    async with httpx.AsyncClient(transport=transport(200, headers, schedule, sent)) as client:
        record = await tts.send(client, "http://tts", "tiny-orpheus", prompt)
    assert record.ok, record.detail
    assert sent == [("/v1/audio/speech", {
        "model": "tiny-orpheus", "input": prompt.text, "voice": "tara", "response_format": "pcm", "stream": True,
    })]  # fmt: skip
    assert (record.status, record.sample_rate, record.input_len) == (200, RATE, 40)
    assert record.stage_ms == {"tokenizer": 1.5, "vocoder_first_chunk": 2.5}
    # The empty chunk neither ends TTFA nor has a due time.
    assert record.chunk_bytes == [800, 800, 1600] and len(record.content_times) == 3
    # Sleeps end late on a busy machine, never early.
    assert 0.1 <= record.content_times[0] < 0.3
    stream = metrics.speech(record)
    assert stream is not None and stream.audio_s == pytest.approx(0.2)
    assert 0.19 <= stream.underrun_s < 0.35
    assert record.latency is not None and stream.rtf == pytest.approx(record.latency / 0.2)


@pytest.mark.parametrize(
    ("status", "headers", "schedule", "error", "detail"),
    [
        (503, {"Retry-After": "1"}, [(0.0, b'{"error": {"message": "at capacity"}}')], "HTTP 503", "at capacity"),
        (200, {}, [(0.0, bytes(800))], "stream", "no valid X-Audio-Sample-Rate header"),
        (200, {"X-Audio-Sample-Rate": "8000"}, [], "stream", "no audio in stream"),
    ],
)
async def test_failed_speech(
    status: int, headers: dict[str, str], schedule: list[tuple[float, bytes]], error: str, detail: str
) -> None:
    async with httpx.AsyncClient(transport=transport(status, headers, schedule)) as client:
        record = await tts.send(client, "http://tts", "tiny-orpheus", tts.SpeechDataset(10).prompt(0))
    assert (record.ok, record.status, record.error) == (False, status, error)
    assert record.detail is not None and detail in record.detail
    assert record.retry_after_s == (1.0 if "Retry-After" in headers else None)
    assert metrics.speech(record) is None


async def test_connection_failure_is_a_failed_record() -> None:
    async with httpx.AsyncClient() as client:
        record = await tts.send(client, "http://127.0.0.1:9", "tiny-orpheus", tts.SpeechDataset(10).prompt(0))
    assert (record.ok, record.status, record.error) == (False, None, "ConnectError")
    assert (record.content_times, record.sample_rate, record.latency is not None) == ([], None, True)
