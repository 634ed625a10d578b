"""`/v1/audio/speech` and `/v1/audio/voices` through the ingress app: prompt building, the default voice,
credits per stream, bad requests, admission, cancellation and deadlines (the response formats are in
test_speech_formats.py).

In-process: the tiny Orpheus's real tokenizer stage, a fake talker that emits audio-code tokens, and
a fake vocoder whose audio encodes which frames it was given (so order and context can be checked).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.requests import ClientDisconnect

from serve_app.errors import DeadlineExceededError, ServiceUnavailableError
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import AudioChunk, VocodeRequest
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.tts_support import (  # noqa: F401  (the fixtures, registered by their names)
    FRAMES,
    SAMPLES,
    SPEECH,
    TOKENS,
    TTS,
    FakeTalker,
    FakeVocoder,
    audio_stream,
    body,
    speech_app_client,
    speech_args_fixture,
    speech_client_fixture,
    speech_services_fixture,
    speech_tokenizer_fixture,
    talker_fixture,
    vocoder_fixture,
)


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
    assert request.sampling.max_tokens == TOKENS


def test_admission_weighs_the_audio_cap_not_the_context(
    speech_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []
    tokenize = speech_services.tokenizer.tokenize

    async def recording(request: Any) -> Any:
        asked.append(request)
        return await tokenize(request)

    monkeypatch.setattr(speech_services.tokenizer, "tokenize", recording)
    assert TestClient(create_app(speech_services)).post(SPEECH, json=body(response_format="pcm")).status_code == 200
    assert [r.max_tokens for r in asked] == [TOKENS]  # what admission weighs before the tokenizer


def test_chunks_carry_context_and_respect_the_credits(speech_client: TestClient, vocoder: FakeVocoder) -> None:
    vocoder.delay_s = 0.01
    assert speech_client.post(SPEECH, json=body(response_format="pcm", stream=True)).status_code == 200
    first, second = vocoder.requests[:2]
    assert (len(first.frames), first.context) == (2, 0)  # small first chunk, nothing before it
    assert (len(second.frames), second.context) == (1 + 2, 1)  # half the audio sent, at least the first's 2
    assert second.frames[0] == first.frames[-1]
    assert vocoder.most_in_flight <= TTS["max_chunks_in_flight"]


def test_a_request_without_voice_speaks_in_the_first_voice(speech_client: TestClient, talker: FakeTalker) -> None:
    fields = {"model": "tiny-orpheus", "input": "Hello there.", "response_format": "pcm"}
    for voice in (None, "tara", "leo"):
        extra = {} if voice is None else {"voice": voice}
        assert speech_client.post(SPEECH, json=fields | extra).status_code == 200
    no_voice, tara, leo = (r.prompt_token_ids for r in talker.requests)
    assert no_voice == tara != leo


def test_the_voices_route_lists_the_models_voices(speech_client: TestClient) -> None:
    response = speech_client.get("/v1/audio/voices")
    assert response.status_code == 200
    assert response.json() == {"voices": ["tara", "leo"], "uploaded_voices": []}


def test_a_text_model_has_no_voices(client: TestClient) -> None:
    response = client.get("/v1/audio/voices")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", "model_not_tts")
    assert "does not generate speech" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"voice": ""}, "voice"),
        ({"input": ""}, "input"),
        ({"input": "   "}, "input"),
        ({"input": "x" * 201}, "input"),
        ({"response_format": "ogg"}, "response_format"),
        ({"response_format": "MP3"}, "response_format"),
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
        async for _ in audio_stream(response):
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
    return Services.create(args, speech_tokenizer, talker, vocoder=vocoder)


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
    async for _ in audio_stream(admitted[0]):
        pass
    later = await asyncio.wait_for(waiting, 5)  # the first stream's end let it in
    for response in [*admitted[1:], later]:
        async for _ in audio_stream(response):
            pass
    assert (slots.held, slots.waiting) == (0, 0)


async def test_a_waiting_stream_ends_at_its_deadline(waiting_services: Services, vocoder: FakeVocoder) -> None:
    from serve_app.ingress.speech.protocol import SpeechRequest
    from serve_app.ingress.speech.serving import create_speech
    from serve_app.messages import Deadline

    services, slots = waiting_services, waiting_services.speech_slots
    vocoder.delay_s = 0.02
    request = SpeechRequest.model_validate(body(stream=True, response_format="pcm"))
    admitted = [await create_speech(services, request) for _ in range(TTS["max_streams"])]
    with pytest.raises(DeadlineExceededError):
        await create_speech(services, request, Deadline.after(0.1))
    assert (slots.held, slots.waiting) == (TTS["max_streams"], 0)
    for response in admitted:
        async for _ in audio_stream(response):
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
    iterator = audio_stream(response)
    await anext(iterator)
    await iterator.aclose()  # the client went away
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
    slow = audio_stream(await create_speech(speech_services, request))
    await anext(slow)  # the client reads one chunk, then stops reading
    await asyncio.sleep(0.05)
    calls_while_stalled = len(vocoder.requests)
    # The first chunk was sent; the stream may then fill its credits, and not one call more.
    assert calls_while_stalled <= 1 + TTS["max_chunks_in_flight"]
    fast = audio_stream(await create_speech(speech_services, request))
    chunks = [chunk async for chunk in fast]
    assert len(b"".join(chunks)) == FRAMES * SAMPLES * 2  # the other stream got all its audio
    # ... in as many calls as chunks of 2, 2, 2, 3, 3, ... frames, while the stalled stream made none.
    assert len(vocoder.requests) == calls_while_stalled + len(GROWING_CHUNKS)
    await slow.aclose()


# The tests' first_chunk_frames 2 and chunk_frames 3, over all 21 frames of a request.
GROWING_CHUNKS = [2, 2, 2, 3, 3, 3, 3, 3]


@pytest.mark.parametrize(("first", "most", "sizes"), [
    (2, 8, [2, 2, 2, 3, 4, 6, 8, 8, 8]),  # the default config's
    (2, 16, [2, 2, 2, 3, 4, 6, 9, 14, 16, 16]),
    (4, 8, [4, 4, 4, 6, 8, 8]),
    (2, 3, GROWING_CHUNKS),
])  # fmt: skip
def test_a_chunk_holds_half_the_frames_sent_before_it_within_bounds(
    speech_args: Any, first: int, most: int, sizes: list[int]
) -> None:
    from serve_app.ingress.speech.serving import next_chunk_frames

    tts = speech_args.tts.model_copy(update={"first_chunk_frames": first, "chunk_frames": most})
    assert [next_chunk_frames(tts, sum(sizes[:i])) for i in range(1, len(sizes))] == sizes[1:]


def test_a_stream_sends_its_frames_in_growing_chunks(
    speech_args: Any, speech_tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder
) -> None:
    assert sum(GROWING_CHUNKS) == FRAMES
    client = speech_app_client(speech_args, speech_tokenizer, talker, vocoder, context_frames=0)
    assert client.post(SPEECH, json=body(response_format="pcm")).status_code == 200
    assert [len(r.frames) for r in vocoder.requests] == GROWING_CHUNKS
    assert all(r.context == 0 for r in vocoder.requests)


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
        await audio_stream(started).aclose()


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
    client = speech_app_client(speech_args, speech_tokenizer, talker, vocoder)
    sent = time.time()
    # PCM: a lossy encoder would hold back the fake vocoder's few samples, and the first delta with them.
    fields = body(stream=True, stream_format="sse", response_format="pcm")
    response = client.post(SPEECH, json=fields, headers={"X-Request-Timeout": "1"})
    elapsed = time.time() - sent
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "deadline_exceeded"
    assert 1 <= elapsed < 5
    assert len(vocoder.requests) > 1
    assert all(r.deadline is not None and 1 <= r.deadline.at - sent <= elapsed for r in vocoder.requests)
    assert talker.closed == 1
    assert vocoder.in_flight == 0  # the stalled call was cancelled
