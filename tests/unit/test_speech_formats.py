"""The response formats of `/v1/audio/speech` through the ingress app: WAV and PCM sample for sample, every
compressed format decoded back (whole and streamed), SSE deltas, and encoders freed with their stream.

In-process, as in test_speech_serving.py: the tiny Orpheus's real tokenizer stage, a fake talker that emits
audio-code tokens, and a fake vocoder whose audio encodes which frames it was given.
"""

from __future__ import annotations

import base64
import io
import wave
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from serve_app.ingress.pipeline.services import Services
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.tts_support import (  # noqa: F401  (the fixtures, registered by their names)
    FRAMES,
    LOSSY_SLACK_S,
    RATE,
    SAMPLES,
    SPEECH,
    TOKENS,
    FakeTalker,
    FakeVocoder,
    audio_stream,
    body,
    decode_audio,
    expected_codes,
    speech_app_client,
    speech_args_fixture,
    speech_client_fixture,
    speech_services_fixture,
    speech_tokenizer_fixture,
    talker_fixture,
    vocoder_fixture,
)


def test_wav_is_a_whole_file_with_every_frame_in_order(speech_client: TestClient) -> None:
    response = speech_client.post(SPEECH, json=body(response_format="wav"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["x-audio-sample-rate"] == "24000"
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    assert list(samples[::SAMPLES]) == expected_codes(FRAMES)


def test_streaming_pcm_equals_the_whole_file(speech_client: TestClient) -> None:
    whole = speech_client.post(SPEECH, json=body(response_format="pcm")).content
    with speech_client.stream("POST", SPEECH, json=body(response_format="pcm", stream=True)) as response:
        assert response.status_code == 200
        streamed = b"".join(response.iter_bytes())
    assert streamed == whole


def test_streaming_wav_has_the_open_ended_header(speech_client: TestClient) -> None:
    content = speech_client.post(SPEECH, json=body(stream=True, response_format="wav")).content
    assert content[:4] == b"RIFF" and content[4:8] == b"\xff\xff\xff\xff"


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", None])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_format_decodes_to_the_spoken_audio(
    speech_client: TestClient, vocoder: FakeVocoder, response_format: str | None, stream: bool
) -> None:
    vocoder.samples_per_frame = 2048  # real-sized frames: a lossy codec's delay is small beside them
    fields = {} if response_format is None else {"response_format": response_format}
    response = speech_client.post(SPEECH, json=body(stream=stream, **fields))
    assert response.status_code == 200
    expected_type = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac"}
    assert response.headers["content-type"] == expected_type.get(response_format or "mp3", "audio/wav")
    source_rate, decoded_rate, samples = decode_audio(response.content)
    assert source_rate == RATE == int(response.headers["x-audio-sample-rate"])
    seconds = FRAMES * 2048 / RATE
    assert seconds - 1e-9 <= len(samples) / decoded_rate <= seconds + LOSSY_SLACK_S


def test_sse_deltas_add_up_to_the_file(speech_client: TestClient, vocoder: FakeVocoder, sse_events: Any) -> None:
    vocoder.samples_per_frame = 2048
    response = speech_client.post(SPEECH, json=body(stream=True, stream_format="sse", response_format="flac"))
    events = [e for e in sse_events(response.text) if e != "[DONE]"]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 2  # sent as it is made
    samples = decode_audio(b"".join(deltas))[2]
    assert list(np.rint(samples[::2048] * 32768)) == expected_codes(FRAMES)  # every frame, in order


def test_a_format_that_cannot_carry_the_models_rate_is_a_400(
    speech_args: Any, speech_tokenizer: TokenizerStage, talker: FakeTalker, vocoder: FakeVocoder
) -> None:
    client = speech_app_client(speech_args, speech_tokenizer, talker, vocoder, sample_rate=44_100)
    response = client.post(SPEECH, json=body(response_format="opus"))
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"
    assert "44100 Hz" in response.json()["error"]["message"]
    assert client.post(SPEECH, json=body(response_format="flac")).status_code == 200


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "sse alone, as OpenAI's API"])
def test_sse_events(speech_client: TestClient, sse_events: Any, stream: bool) -> None:
    response = speech_client.post(SPEECH, json=body(stream=stream, stream_format="sse"))
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in sse_events(response.text) if e != "[DONE]"]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == TOKENS
    assert events[-1]["finish_reason"] == "length"  # the fake talker never stops: cut at the audio cap


@pytest.mark.parametrize("reason", ["length", "stop"])
def test_the_finish_reason_says_whether_the_audio_was_cut(
    speech_client: TestClient, talker: FakeTalker, reason: str
) -> None:
    talker.finish_reason = reason
    response = speech_client.post(SPEECH, json=body(response_format="wav"))
    assert response.headers["x-finish-reason"] == reason


async def test_an_abandoned_stream_frees_its_encoder(
    speech_services: Services, vocoder: FakeVocoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serve_app.audio_formats import AudioEncoder, open_encoder
    from serve_app.ingress.speech import serving
    from serve_app.ingress.speech.protocol import SpeechRequest

    opened: list[AudioEncoder] = []

    def recording_open(*args: Any, **kwargs: Any) -> AudioEncoder:
        opened.append(open_encoder(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(serving, "open_encoder", recording_open)
    vocoder.samples_per_frame = 2048
    response = await serving.create_speech(speech_services, SpeechRequest.model_validate(body(stream=True)))
    iterator = audio_stream(response)
    assert await anext(iterator)  # some MP3
    await iterator.aclose()  # the client went away
    (encoder,) = opened
    with pytest.raises(ValueError, match="closed"):
        encoder.encode(b"\0\0")
    assert speech_services.speech_slots.held == 0
