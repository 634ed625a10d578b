"""The hostile-input corpus (tests/hostile_corpus.py) against the in-process apps: text, vision, speech.

Real tokenizer stages (and the real multimodal stage for images), fake engines: every case must be a
4xx OpenAI error that never reaches an engine, and each app must serve a good request afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.config import AppArgs
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from serve_app.stages.multimodal import MultimodalStage
from serve_app.stages.tokenizer import TokenizerStage
from tests.hostile_corpus import CASES, HI, SPEECH, HostileCase, check_error
from tests.unit.conftest import FakeLLM
from tests.unit.tts_support import (  # noqa: F401  (the fixtures, registered by their names)
    FakeTalker,
    FakeVocoder,
    speech_args_fixture,
    speech_tokenizer_fixture,
)


@pytest.fixture(scope="module")
def engines(speech_tokenizer: TokenizerStage) -> dict[str, Any]:
    """One fake engine per app, shared by the module: no case may ever reach one."""
    assert speech_tokenizer.layout is not None
    return {"text": FakeLLM(), "vision": FakeLLM(), "speech": FakeTalker(speech_tokenizer.layout)}


@pytest.fixture(scope="module")
def apps(
    app_args: AppArgs,
    tokenizer_stage: TokenizerStage,
    vision_args: AppArgs,
    vision_tokenizer: TokenizerStage,
    speech_args: AppArgs,
    speech_tokenizer: TokenizerStage,
    engines: dict[str, Any],
) -> Iterator[dict[str, TestClient]]:
    multimodal = MultimodalStage.from_args(vision_args)
    services = {
        "text": Services.create(app_args, tokenizer_stage, engines["text"]),
        "vision": Services.create(vision_args, vision_tokenizer, engines["vision"], multimodal),
        "speech": Services.create(speech_args, speech_tokenizer, engines["speech"], vocoder=FakeVocoder()),
    }
    # raise_server_exceptions=False: a bug must show as the 500 a client would get, not as a traceback.
    yield {name: TestClient(create_app(s), raise_server_exceptions=False) for name, s in services.items()}


def send(client: TestClient, case: HostileCase) -> Any:
    return client.request(case.method, case.path, content=case.content(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_request_is_a_4xx_openai_error(apps: dict[str, TestClient], engines: dict[str, Any],
                                               case: HostileCase) -> None:  # fmt: skip
    before = len(engines[case.app].requests)  # the module's cases share the fakes
    response = send(apps[case.app], case)
    check_error(case, response.status_code, response.content)
    assert engines[case.app].requests[before:] == []  # refused before the engine


def test_every_app_serves_a_good_request_after_the_corpus(apps: dict[str, TestClient]) -> None:
    for case in CASES:
        send(apps[case.app], case)
    chat = {"messages": HI, "max_tokens": 2}
    assert apps["text"].post("/v1/chat/completions", json=chat).status_code == 200
    assert apps["vision"].post("/v1/chat/completions", json=chat).status_code == 200
    speech = apps["speech"].post(SPEECH, json={"input": "Hello there.", "voice": "tara"})
    # No response_format: OpenAI's default, MP3.
    assert (speech.status_code, speech.headers["content-type"]) == (200, "audio/mpeg")


def test_every_listed_kind_of_hostile_input_is_covered() -> None:
    kinds = ["json-", "invalid-utf8", "lone-surrogate", "type-", "unknown-", "huge-", "negative-", "nan-", "inf-",
             "empty-", "role-", "over-context", "huge-n", "huge-max-tokens", "oversized-body", "bad-base64",
             "not-an-image", "image-bomb", "too-many-images", "url-", "speech-"]  # fmt: skip
    names = [case.name for case in CASES]
    assert [kind for kind in kinds if not any(kind in name for name in names)] == []
    assert {case.app for case in CASES if case.integration} == {"text", "vision", "speech"}


VLLM_EXTRAS = {"top_k": 5, "min_p": 0.1, "ignore_eos": True, "repetition_penalty": 1.1, "min_tokens": 1,
               "stop_token_ids": [3], "skip_special_tokens": False, "include_stop_str_in_output": True,
               "truncate_prompt_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip


def test_the_vllm_extensions_we_implement_are_not_unknown_fields(client: TestClient, fake_llm: FakeLLM) -> None:
    response = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2} | VLLM_EXTRAS)
    assert response.status_code == 200, response.text
    spec = fake_llm.requests[0].sampling
    assert (spec.top_k, spec.min_p, spec.ignore_eos, spec.stop_token_ids) == (5, 0.1, True, [3])


def test_unknown_fields_are_named_in_the_error(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": HI, "temprature": 0.5})
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (400, "temprature")
    assert "Extra inputs are not permitted" in error["message"]
