"""`/v1/audio/speech` through the ingress app: prompt building, credits per stream, formats, admission.

In-process: the tiny Orpheus's real tokenizer stage, a fake talker that emits audio-code tokens, and
a fake vocoder whose audio encodes which frames it was given (so order and context can be checked).
"""

from __future__ import annotations

import asyncio
import io
import math
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.requests import ClientDisconnect

from serve_app.config import parse_app_args
from serve_app.errors import DeadlineExceededError, ServiceUnavailableError
from serve_app.ingress.app import create_app
from serve_app.ingress.clients import LocalTokenizer
from serve_app.ingress.pipeline import Services
from serve_app.messages import AudioChunk, VocodeRequest
from serve_app.models.tiny_orpheus import ensure_tiny_orpheus_model
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import REPO
from tests.unit.tts_support import RATE, SAMPLES, TTS, FakeTalker, FakeVocoder

SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def orpheus_path() -> Path:
    return ensure_tiny_orpheus_model(REPO / "models" / "tiny-orpheus")


@pytest.fixture(scope="module")
def speech_args(orpheus_path: Path) -> Any:
    model = {"path": str(orpheus_path), "served_model_name": "tiny-orpheus", "max_model_len": 2048}
    return parse_app_args({"model": model, "tts": TTS})


@pytest.fixture(scope="module")
def speech_tokenizer(speech_args: Any) -> Iterator[TokenizerStage]:
    stage = TokenizerStage.from_args(speech_args)
    yield stage
    stage.close()


@pytest.fixture
def talker(speech_tokenizer: TokenizerStage) -> FakeTalker:
    assert speech_tokenizer.speech_layout is not None
    return FakeTalker(speech_tokenizer.speech_layout)


@pytest.fixture
def vocoder() -> FakeVocoder:
    return FakeVocoder()


@pytest.fixture
def speech_services(
    speech_args: Any, speech_tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder
) -> Any:
    return Services.create(speech_args, LocalTokenizer(speech_tokenizer), talker, vocoder=vocoder)


@pytest.fixture
def speech_client(speech_services: Services) -> TestClient:
    return TestClient(create_app(speech_services))


def expected_codes(frames: int) -> list[int]:
    """The first code of each frame the fake talker emits: token k carries code k."""
    return [7 * f for f in range(frames)]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny-orpheus", "input": "Hello there.", "voice": "tara"} | fields


def test_prompt_follows_the_orpheus_layout(
    speech_client: TestClient, talker: FakeTalker, speech_tokenizer: Any
) -> None:
    assert speech_client.post(SPEECH, json=body(response_format="pcm")).status_code == 200
    (request,) = talker.requests
    layout = talker.layout
    ids = request.prompt_token_ids
    assert ids[: len(layout.start_ids)] == layout.start_ids
    assert ids[-len(layout.end_ids) :] == layout.end_ids
    assert request.sampling.audio_codes
    # 1 s + 12 chars x 0.05 s = 1.6 s of audio at most: 19 frames of 2048 samples at 24 kHz, 7 tokens each.
    assert request.sampling.max_tokens == 19 * 7 + 16


def test_wav_is_a_whole_file_with_every_frame_in_order(speech_client: TestClient) -> None:
    response = speech_client.post(SPEECH, json=body())
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["x-audio-sample-rate"] == "24000"
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    frames = (19 * 7 + 16) // 7
    assert list(samples[::SAMPLES]) == expected_codes(frames)


def test_chunks_carry_context_and_respect_the_credits(speech_client: TestClient, vocoder: FakeVocoder) -> None:
    vocoder.delay_s = 0.01
    assert speech_client.post(SPEECH, json=body(response_format="pcm", stream=True)).status_code == 200
    first, second = vocoder.requests[:2]
    assert (len(first.frames), first.context) == (2, 0)  # small first chunk, nothing before it
    assert (len(second.frames), second.context) == (1 + 3, 1)
    assert second.frames[0] == first.frames[-1]
    assert vocoder.most_in_flight <= TTS["max_chunks_in_flight"]


def test_streaming_pcm_equals_the_whole_file(speech_client: TestClient) -> None:
    whole = speech_client.post(SPEECH, json=body(response_format="pcm")).content
    with speech_client.stream("POST", SPEECH, json=body(response_format="pcm", stream=True)) as response:
        assert response.status_code == 200
        streamed = b"".join(response.iter_bytes())
    assert streamed == whole


def test_streaming_wav_has_the_open_ended_header(speech_client: TestClient) -> None:
    content = speech_client.post(SPEECH, json=body(stream=True)).content
    assert content[:4] == b"RIFF" and content[4:8] == b"\xff\xff\xff\xff"


def test_sse_events(speech_client: TestClient, sse_events: Any) -> None:
    response = speech_client.post(SPEECH, json=body(stream=True, stream_format="sse"))
    events = [e for e in sse_events(response.text) if e != "[DONE]"]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == 19 * 7 + 16


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"input": ""}, "input"),
        ({"input": "   "}, "input"),
        ({"input": "x" * 201}, "input"),
        ({"response_format": "mp3"}, "response_format"),
        ({"speed": 2.0}, "speed"),
        ({"instructions": "whisper"}, "instructions"),
        ({"model": "other"}, "model"),
    ],
)
def test_bad_requests(speech_client: TestClient, fields: dict[str, Any], param: str) -> None:
    response = speech_client.post(SPEECH, json=body(**fields))
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["param"] == param


def test_a_text_model_does_not_speak(client: TestClient) -> None:
    response = client.post(SPEECH, json={"input": "hi", "voice": "tara"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "model_not_tts"


async def test_admission_refuses_streams_beyond_max_streams(speech_services: Services, vocoder: FakeVocoder) -> None:
    services = speech_services
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    vocoder.delay_s = 0.05
    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    admitted = [await create_speech(services, request) for _ in range(TTS["max_streams"])]
    with pytest.raises(ServiceUnavailableError, match="speech streams"):
        await create_speech(services, request)
    for response in admitted:
        async for _ in response.body_iterator:
            pass
    assert services.speech_slots.held == 0
    await create_speech(services, request)  # a slot is free again


@pytest.fixture
def waiting_services(
    speech_args: Any, speech_tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder
) -> Services:
    """Speech services where one request may wait for a stream slot."""
    assert speech_args.tts is not None
    args = speech_args.model_copy(update={"tts": speech_args.tts.model_copy(update={"max_waiting_streams": 1})})
    return Services.create(args, LocalTokenizer(speech_tokenizer), talker, vocoder=vocoder)


async def test_a_stream_beyond_max_streams_waits_for_a_slot(waiting_services: Services, vocoder: FakeVocoder) -> None:
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    services, slots = waiting_services, waiting_services.speech_slots
    vocoder.delay_s = 0.02
    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    admitted = [await create_speech(services, request) for _ in range(TTS["max_streams"])]
    waiting = asyncio.ensure_future(create_speech(services, request))
    await asyncio.sleep(0.05)
    assert not waiting.done() and slots.waiting == 1
    with pytest.raises(ServiceUnavailableError, match="1 are waiting"):
        await create_speech(services, request)
    async for _ in admitted[0].body_iterator:
        pass
    later = await asyncio.wait_for(waiting, 5)  # the first stream's end let it in
    for response in [*admitted[1:], later]:
        async for _ in response.body_iterator:
            pass
    assert (slots.held, slots.waiting) == (0, 0)


async def test_a_waiting_stream_ends_at_its_deadline(waiting_services: Services, vocoder: FakeVocoder) -> None:
    from serve_app.ingress.deadline import Deadline
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    services, slots = waiting_services, waiting_services.speech_slots
    vocoder.delay_s = 0.02
    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    admitted = [await create_speech(services, request) for _ in range(TTS["max_streams"])]
    with pytest.raises(DeadlineExceededError):
        await create_speech(services, request, Deadline.after(0.1))
    assert (slots.held, slots.waiting) == (TTS["max_streams"], 0)
    for response in admitted:
        async for _ in response.body_iterator:
            pass
    assert slots.held == 0


async def test_a_client_gone_before_the_first_byte_gives_its_slot_back(
    speech_services: Services, talker: FakeTalker
) -> None:
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    response = await create_speech(speech_services, SpeechRequest.model_validate(body(stream=True)))

    async def gone(message: Any) -> None:
        raise OSError("the client went away")

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        await response(scope, receive, gone)  # the body iterator never starts
    assert speech_services.speech_slots.held == 0 and talker.closed == 1


async def test_a_closed_stream_cancels_its_work(
    speech_services: Services, talker: FakeTalker, vocoder: FakeVocoder
) -> None:
    services = speech_services
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    vocoder.delay_s = 0.02
    response = await create_speech(services, SpeechRequest.model_validate(body(stream=True, response_format="pcm")))
    iterator = response.body_iterator
    await anext(iterator)  # type: ignore[call-overload]
    await iterator.aclose()  # type: ignore[attr-defined]  # the client went away
    assert talker.closed == 1
    assert services.speech_slots.held == 0
    await asyncio.sleep(0.05)
    assert vocoder.in_flight == 0


def test_a_vocoder_failure_before_the_first_byte_is_a_status(speech_client: TestClient, vocoder: FakeVocoder) -> None:
    vocoder.error = ServiceUnavailableError("vocoder down")
    response = speech_client.post(SPEECH, json=body(stream=True))
    assert response.status_code == 503


async def test_a_failure_before_the_first_byte_gives_the_slot_back(
    speech_services: Services, vocoder: FakeVocoder
) -> None:
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    vocoder.error = ServiceUnavailableError("vocoder down")
    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    for _ in range(TTS["max_streams"] + 1):
        with pytest.raises(ServiceUnavailableError, match="vocoder down"):
            await create_speech(speech_services, request)
        assert speech_services.speech_slots.held == 0


async def test_a_slow_client_holds_back_only_its_own_stream(
    speech_services: Services, talker: FakeTalker, vocoder: FakeVocoder
) -> None:
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    slow = (await create_speech(speech_services, request)).body_iterator
    await anext(slow)  # type: ignore[call-overload]  # the client reads one chunk, then stops reading
    await asyncio.sleep(0.05)
    calls_while_stalled = len(vocoder.requests)
    # The first chunk was sent; the stream may then fill its credits, and not one call more.
    assert calls_while_stalled <= 1 + TTS["max_chunks_in_flight"]
    fast = (await create_speech(speech_services, request)).body_iterator
    chunks = [chunk async for chunk in fast]  # type: ignore[attr-defined]
    frames = (19 * 7 + 16) // 7
    assert len(b"".join(chunks)) == frames * SAMPLES * 2  # the other stream got all its audio
    # ... in 1 + ceil((21 - 2) / 3) calls, while the stalled stream made none.
    assert len(vocoder.requests) == calls_while_stalled + 1 + math.ceil((frames - 2) / 3)
    await slow.aclose()  # type: ignore[attr-defined]


def test_without_context_later_chunks_still_have_chunk_frames(
    speech_args: Any, speech_tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder
) -> None:
    args = speech_args.model_copy(update={"tts": speech_args.tts.model_copy(update={"context_frames": 0})})
    client = TestClient(create_app(Services.create(args, LocalTokenizer(speech_tokenizer), talker, vocoder=vocoder)))
    assert client.post(SPEECH, json=body(response_format="pcm")).status_code == 200
    sizes = [len(r.frames) for r in vocoder.requests]
    assert sizes[:3] == [2, 3, 3] and all(r.context == 0 for r in vocoder.requests)


async def test_a_refused_stream_is_counted_as_max_streams(speech_services: Services, speech_client: TestClient) -> None:
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech

    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    admitted = [await create_speech(speech_services, request) for _ in range(TTS["max_streams"])]
    response = speech_client.post(SPEECH, json=body(stream=True))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "overloaded"
    metrics = speech_client.get("/metrics").text
    assert 'serve_graph_rejections_total{reason="max_streams",stage="ingress"} 1.0' in metrics
    for started in admitted:
        await started.body_iterator.aclose()  # type: ignore[attr-defined]


class StallingVocoder(FakeVocoder):
    """Answers its first call, then never another."""

    async def decode(self, request: VocodeRequest) -> AudioChunk:
        if self.requests:
            self.delay_s = 3600
        return await super().decode(request)


def test_the_deadline_reaches_the_vocoder_and_ends_an_sse_stream(
    speech_args: Any, speech_tokenizer: TokenizerStage, talker: FakeTalker, sse_events: Any
) -> None:
    vocoder = StallingVocoder()
    client = TestClient(
        create_app(Services.create(speech_args, LocalTokenizer(speech_tokenizer), talker, vocoder=vocoder))
    )
    sent = time.time()
    response = client.post(SPEECH, json=body(stream=True, stream_format="sse"), headers={"X-Request-Timeout": "1"})
    elapsed = time.time() - sent
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "deadline_exceeded"
    assert 1 <= elapsed < 5
    assert len(vocoder.requests) > 1
    assert all(r.deadline is not None and 1 <= r.deadline - sent <= elapsed for r in vocoder.requests)
    assert talker.closed == 1
    assert vocoder.in_flight == 0  # the stalled call was cancelled
