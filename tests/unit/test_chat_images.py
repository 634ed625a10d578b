"""Image chat through the ingress app: the multimodal hop, placeholders, usage, metrics, body limits.

In-process stages: a fake multimodal client (the stage itself is tested in test_multimodal.py), the
tiny LLaVA's real tokenizer stage and `FakeLLM`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.config import parse_app_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import ImagesRequest
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.admission_support import RATES
from tests.unit.conftest import FakeLLM
from tests.unit.media_support import TOKENS_PER_IMAGE, FakeMultimodal, image_message

CHAT = "/v1/chat/completions"
MAX_REQUEST_BYTES = 4096


@pytest.fixture(scope="module")
def vision_args(tiny_vision_model_path: Path) -> Any:
    return parse_app_args({
        "model": {"path": str(tiny_vision_model_path), "served_model_name": "tiny-llava", "max_model_len": 256},
        "limits": {"max_request_bytes": MAX_REQUEST_BYTES},
        "multimodal": {},
    })  # fmt: skip


@pytest.fixture
def multimodal() -> FakeMultimodal:
    return FakeMultimodal()


@pytest.fixture
def vision_client(vision_args: Any, vision_tokenizer: TokenizerStage, fake_llm: FakeLLM, multimodal: Any) -> Any:
    services = Services.create(vision_args, vision_tokenizer, fake_llm, multimodal)
    return TestClient(create_app(services))


def test_images_go_to_the_multimodal_stage_and_then_to_the_llm(
    vision_client: TestClient, multimodal: FakeMultimodal, fake_llm: FakeLLM
) -> None:
    response = vision_client.post(CHAT, json={"messages": image_message("data:a", "data:b"), "max_tokens": 3})
    assert response.status_code == 200, response.text
    assert multimodal.requests == [ImagesRequest(["data:a", "data:b"])]
    (generated,) = fake_llm.requests
    assert [image.content_hash for image in generated.images] == ["data:a", "data:b"]
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == len(generated.prompt_token_ids) + 2 * (TOKENS_PER_IMAGE - 1)
    assert float(response.headers["X-Multimodal-Time"]) == pytest.approx(2.0)


def test_streaming_usage_counts_image_tokens(vision_client: TestClient, fake_llm: FakeLLM, sse_events: Any) -> None:
    body = {"messages": image_message("data:a"), "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    response = vision_client.post(CHAT, json=body)
    assert response.status_code == 200
    usage = sse_events(response.text)[-2]["usage"]
    assert usage["prompt_tokens"] == len(fake_llm.requests[0].prompt_token_ids) + TOKENS_PER_IMAGE - 1


def test_text_only_requests_skip_the_multimodal_stage(vision_client: TestClient, multimodal: FakeMultimodal) -> None:
    response = vision_client.post(CHAT, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert response.status_code == 200
    assert multimodal.requests == []


def test_image_errors_are_400s(vision_client: TestClient, fake_llm: FakeLLM) -> None:
    response = vision_client.post(CHAT, json={"messages": image_message("bad:x"), "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_image"
    assert fake_llm.requests == []


def test_image_cache_hits_are_counted(vision_client: TestClient) -> None:
    for _ in range(2):
        assert vision_client.post(CHAT, json={"messages": image_message("data:a"), "max_tokens": 1}).status_code == 200
    metrics = vision_client.get("/metrics").text
    assert 'serve_graph_image_cache_total{result="hit"} 1.0' in metrics
    assert 'serve_graph_image_cache_total{result="miss"} 1.0' in metrics


def test_a_text_model_says_it_has_no_vision(client: TestClient) -> None:
    response = client.post(CHAT, json={"messages": image_message("data:a"), "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "model_not_multimodal"


def test_an_oversized_body_is_413_before_parsing(vision_client: TestClient, multimodal: FakeMultimodal) -> None:
    body = {"messages": image_message("data:image/png;base64," + "A" * MAX_REQUEST_BYTES), "max_tokens": 1}
    response = vision_client.post(CHAT, json=body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert multimodal.requests == []
    assert vision_client.post(CHAT, json={"messages": image_message("data:a"), "max_tokens": 1}).status_code == 200


def test_an_oversized_chunked_body_is_413(vision_client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(MAX_REQUEST_BYTES // 512 + 1):
            yield b"x" * 512
        yield b'"}]}'

    response = vision_client.post(CHAT, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_admission_learns_tokens_per_character_from_the_text_alone(
    vision_args: Any, vision_tokenizer: TokenizerStage, multimodal: FakeMultimodal
) -> None:
    # Admission weighs an image's tokens apart from its text's: learning them as text would weigh every later
    # prompt character as if it came with a share of an image.
    args = vision_args.model_copy(update={"admission": RATES})
    learned = []
    for messages in (image_message("data:a", "data:b"), [{"role": "user", "content": "What is this?"}]):
        services = Services.create(args, vision_tokenizer, FakeLLM(), multimodal)
        assert services.work is not None
        response = TestClient(create_app(services)).post(CHAT, json={"messages": messages, "max_tokens": 1})
        assert response.status_code == 200, response.text
        learned.append(services.work.tokens_per_char)
    with_images, text_alone = learned
    assert with_images == pytest.approx(text_alone, abs=0.05), learned  # the placeholders' newlines at most
