"""serve_app/ingress/pipeline/router.py through the app: one base URL for a text, a vision and a speech model,
each request routed by its `model` to that model's own stages, limits, admission and health.

In-process stages: the real tokenizer stages of the tiny models, FakeLLM/FakeMultimodal for the text
and vision models, the speech tests' fake talker and vocoder.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.config import AppArgs, parse_app_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.router import ModelRouter
from serve_app.ingress.pipeline.services import Services
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import FakeLLM
from tests.unit.media_support import FakeMultimodal, image_message
from tests.unit.tts_support import (  # noqa: F401  (the fixtures, registered by their names)
    FakeTalker,
    body,
    speech_args_fixture,
    speech_services_fixture,
    speech_tokenizer_fixture,
    talker_fixture,
    vocoder_fixture,
)

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def vision_args(tiny_vision_model_path: Path) -> AppArgs:
    # Admission by work at 150 prompt tokens/s: a few hundred tokens admitted fill it (test below).
    return parse_app_args({
        "model": {"path": str(tiny_vision_model_path), "served_model_name": "tiny-llava", "max_model_len": 256},
        "multimodal": {},
        "admission": {"prefill_tokens_per_s": 150, "decode_tokens_per_s": 1e6, "max_wait_s": 1.0},
    })  # fmt: skip


@pytest.fixture
def vision_llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def multimodal() -> FakeMultimodal:
    return FakeMultimodal()


@pytest.fixture
def vision_services(
    vision_args: AppArgs, vision_tokenizer: TokenizerStage, vision_llm: FakeLLM, multimodal: FakeMultimodal
) -> Services:
    return Services.create(vision_args, vision_tokenizer, vision_llm, multimodal)


@pytest.fixture
def router(services: Services, vision_services: Services, speech_services: Services) -> ModelRouter:
    return ModelRouter([services, vision_services, speech_services])


@pytest.fixture
def graph(router: ModelRouter) -> TestClient:
    return TestClient(create_app(router))


def chat(graph: TestClient, model: str | None, messages: list[dict[str, Any]] = HELLO) -> Any:
    payload: dict[str, Any] = {"messages": messages, "max_tokens": 2}
    return graph.post(CHAT, json=payload if model is None else payload | {"model": model})


def cards_of(graph: TestClient) -> list[str]:
    return [card["id"] for card in graph.get("/v1/models").json()["data"]][:2]


def test_models_lists_every_model_with_its_capabilities(graph: TestClient) -> None:
    cards = {card["id"]: card for card in graph.get("/v1/models").json()["data"]}
    assert {name: card["capabilities"] for name, card in cards.items()} == {
        "tiny-chat": ["chat", "completions"],
        "tiny-llava": ["chat", "completions", "vision"],
        "tiny-orpheus": ["chat", "completions", "speech"],
    }
    assert cards["tiny-llava"]["max_model_len"] == 256 and cards["tiny-chat"]["object"] == "model"


def test_each_request_goes_to_its_models_stages(
    graph: TestClient, fake_llm: FakeLLM, vision_llm: FakeLLM, multimodal: FakeMultimodal, talker: FakeTalker
) -> None:
    response = chat(graph, "tiny-chat")
    assert response.status_code == 200 and response.json()["model"] == "tiny-chat"
    assert len(fake_llm.requests) == 1 and not vision_llm.requests

    response = chat(graph, "tiny-llava", image_message("data:image/png;base64,AAAA"))
    assert response.status_code == 200 and response.json()["model"] == "tiny-llava"
    assert len(vision_llm.requests) == 1 and len(fake_llm.requests) == 1
    assert [r.urls for r in multimodal.requests] == [["data:image/png;base64,AAAA"]]

    response = graph.post("/v1/audio/speech", json=body(response_format="pcm"))
    assert response.status_code == 200 and response.content
    assert len(fake_llm.requests) == 1 and len(vision_llm.requests) == 1

    completion = graph.post("/v1/completions", json={"model": "tiny-llava", "prompt": "Hi", "max_tokens": 1})
    assert completion.status_code == 200 and len(vision_llm.requests) == 2
    tokenized = {
        m: graph.post("/tokenize", json={"model": m, "prompt": "Hi"}).json() for m in ("tiny-chat", "tiny-llava")
    }
    assert tokenized["tiny-chat"]["max_model_len"] == 128 and tokenized["tiny-llava"]["max_model_len"] == 256


def test_a_model_without_the_capability_is_a_400_naming_both(graph: TestClient) -> None:
    images = chat(graph, "tiny-chat", image_message("data:image/png;base64,AAAA"))
    assert images.status_code == 400
    assert "`tiny-chat`" in images.json()["error"]["message"] and "image" in images.json()["error"]["message"]
    speech = graph.post("/v1/audio/speech", json=body(model="tiny-llava"))
    assert speech.status_code == 400
    assert "`tiny-llava`" in speech.json()["error"]["message"] and "speech" in speech.json()["error"]["message"]
    voices = graph.get("/v1/audio/voices", params={"model": "tiny-chat"})
    assert voices.status_code == 400 and "`tiny-chat`" in voices.json()["error"]["message"]


def test_an_unknown_model_is_a_404(graph: TestClient) -> None:
    for response in (chat(graph, "nope"), graph.post("/v1/audio/speech", json=body(model="nope"))):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found" and response.json()["error"]["param"] == "model"


def test_without_a_model_a_request_goes_to_the_first_model_able_to_serve_it(graph: TestClient) -> None:
    missing = chat(graph, None)
    assert missing.status_code == 200 and missing.json()["model"] == "tiny-chat"  # the config's first, as vLLM
    empty = chat(graph, "")  # vLLM's server takes an empty name as none
    assert empty.status_code == 200 and empty.json()["model"] == "tiny-chat"
    # Speech: the first model that speaks.
    assert graph.get("/v1/audio/voices").json()["voices"] == ["tara", "leo"]
    assert graph.get("/v1/audio/voices", params={"model": "tiny-orpheus"}).json()["voices"] == ["tara", "leo"]
    speech = graph.post("/v1/audio/speech", json={"input": "Hi.", "voice": "tara", "response_format": "pcm"})
    assert speech.status_code == 200


def test_one_full_model_does_not_refuse_another(graph: TestClient, vision_services: Services) -> None:
    assert vision_services.work is not None
    ahead = vision_services.work.admit(prompt_tokens=1000, max_tokens=0)  # ~6.7 s of work: over max_wait_s
    try:
        refused = chat(graph, "tiny-llava")
        assert refused.status_code == 503 and "Retry-After" in refused.headers
        assert chat(graph, "tiny-chat").status_code == 200
    finally:
        ahead.release()
    assert chat(graph, "tiny-llava").status_code == 200


def test_health_names_each_models_stages(router: ModelRouter, graph: TestClient) -> None:
    async def poll() -> None:
        await asyncio.gather(*(s.health.poll_once() for s in router.models.values()))

    asyncio.run(poll())
    response = graph.get("/health")
    assert response.status_code == 200, response.json()
    assert set(response.json()["stages"]) == {
        "tiny-chat/tokenizer", "tiny-chat/llm", "tiny-llava/tokenizer", "tiny-llava/llm",
        "tiny-llava/multimodal", "tiny-orpheus/tokenizer", "tiny-orpheus/llm", "tiny-orpheus/vocoder",
    }  # fmt: skip
    router.models["tiny-llava"].health.mark_failed("llm", "engine died")
    response = graph.get("/health")
    assert response.status_code == 503 and response.json()["stages"]["tiny-llava/llm"] == "engine died"
    assert router.health_report()[1]["tiny-chat/llm"] == "ok"


def test_metrics_are_labelled_by_model(graph: TestClient) -> None:
    assert chat(graph, "tiny-chat").status_code == 200
    assert chat(graph, "tiny-llava").status_code == 200
    text = graph.get("/metrics").text
    assert text.count("# TYPE serve_graph_tokens_total counter") == 1  # one family, however many models
    assert 'serve_graph_tokens_total{kind="generated",model="tiny-chat"} 2.0' in text
    assert 'serve_graph_tokens_total{kind="generated",model="tiny-llava"} 2.0' in text
    assert 'serve_graph_requests_total{endpoint="/v1/chat/completions",status="200"} 2.0' in text
    assert 'fake_llm_up{model="tiny-llava"} 1.0' in text


def test_lookup_is_for_middlewares_before_the_body_is_parsed(router: ModelRouter, services: Services) -> None:
    assert router.lookup("tiny-chat") is services
    assert router.lookup("nope") is None
    assert router.lookup(None) is services  # the first model, as the routes pick it
    assert ModelRouter([services]).lookup(None) is services
