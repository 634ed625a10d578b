"""The hostile-input corpus's `integration` cases against the real graph, on all three applications.

Each case must be a 4xx OpenAI error over real HTTP (through Ray Serve's proxy and every stage); after
the whole corpus each application is healthy and serves a good request.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.hostile_corpus import CASES, HostileCase, check_error, png
from tests.integration.support import TTS_PREFIX, VISION_PREFIX
from tests.unit.media_support import data_url

PREFIX = {"text": "", "vision": VISION_PREFIX, "speech": TTS_PREFIX}
SUBSET = [case for case in CASES if case.integration]


def send(graph: str, case: HostileCase) -> httpx.Response:
    url = f"{graph}{PREFIX[case.app]}{case.path}"
    return httpx.request(
        case.method, url, content=case.content(), headers={"content-type": "application/json"}, timeout=60
    )


@pytest.mark.parametrize("case", SUBSET, ids=[case.name for case in SUBSET])
def test_hostile_request_is_a_4xx_openai_error(graph: str, case: HostileCase) -> None:
    response = send(graph, case)
    check_error(case, response.status_code, response.content)


def test_every_application_is_healthy_and_serves_after_the_corpus(
    graph: str, client: Any, vision_client: Any, tts_client: Any
) -> None:
    for case in SUBSET:
        send(graph, case)
    for prefix in PREFIX.values():
        assert httpx.get(f"{graph}{prefix}/health", timeout=5).status_code == 200, prefix
    hi = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="tiny-chat", messages=hi, max_tokens=2).choices
    image = {"type": "image_url", "image_url": {"url": data_url(png())}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    assert vision_client.chat.completions.create(model="tiny-llava", messages=messages, max_tokens=2).choices
    audio = tts_client.audio.speech.create(
        model="tiny-orpheus", voice="tara", input="Still here.", response_format="wav"
    )
    assert audio.content[:4] == b"RIFF"
