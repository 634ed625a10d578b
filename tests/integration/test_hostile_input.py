"""The hostile-input corpus's `integration` cases against the real graph, on all three applications.

Each case must be a 4xx OpenAI error over real HTTP (through Ray Serve's proxy and every stage); after
the whole corpus each application is healthy and serves a good request.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.hostile_corpus import CASES, HostileCase, check_error, png
from tests.integration.support import TEXT_MODEL, TTS_MODEL, VISION_MODEL
from tests.unit.media_support import data_url

# One base URL serves every model: a case reaches the model of its kind by naming it.
MODEL = {"text": TEXT_MODEL, "vision": VISION_MODEL, "speech": TTS_MODEL}
SUBSET = [case for case in CASES if case.integration]


def with_model(case: HostileCase) -> bytes:
    """The case's body naming its model, unless it names one or is not a JSON object: the corpus
    leaves `model` out, which a server of several models refuses first (400 naming `model`). Inserted
    as text, so that the rest of a deliberately odd body is sent byte for byte."""
    content = case.content()
    if not content.startswith(b"{") or b'"model"' in content:
        return content
    return b'{"model": "' + MODEL[case.app].encode() + b'", ' + content[1:] if content != b"{}" else content


def send(graph: str, case: HostileCase) -> httpx.Response:
    return httpx.request(
        case.method, f"{graph}{case.path}", content=with_model(case), headers={"content-type": "application/json"},
        timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("case", SUBSET, ids=[case.name for case in SUBSET])
def test_hostile_request_is_a_4xx_openai_error(graph: str, case: HostileCase) -> None:
    response = send(graph, case)
    check_error(case, response.status_code, response.content)


def test_every_application_is_healthy_and_serves_after_the_corpus(
    graph: str, client: Any, vision_client: Any, tts_client: Any
) -> None:
    for case in SUBSET:
        send(graph, case)
    assert httpx.get(f"{graph}/health", timeout=5).status_code == 200
    hi = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="tiny-chat", messages=hi, max_tokens=2).choices
    image = {"type": "image_url", "image_url": {"url": data_url(png())}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    assert vision_client.chat.completions.create(model="tiny-llava", messages=messages, max_tokens=2).choices
    audio = tts_client.audio.speech.create(
        model="tiny-orpheus", voice="tara", input="Still here.", response_format="wav"
    )
    assert audio.content[:4] == b"RIFF"
