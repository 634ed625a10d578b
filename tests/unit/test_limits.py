"""Request limits from the YAML (`limits:`, `auth:`): safe defaults, and what the app does at each."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.config import AppArgs, LimitsConfig, ModelConfig, parse_app_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.conftest import FakeLLM

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def capped(raw_args: dict[str, Any], services: Services) -> TestClient:
    services.args = parse_app_args(raw_args | {"limits": raw_args["limits"] | {"max_tokens": 10}})
    return TestClient(create_app(services))


def test_max_tokens_over_the_cap_is_a_400(capped: TestClient, fake_llm: FakeLLM) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        response = capped.post(CHAT, json={"messages": HI, field: 11})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == field  # the field the client sent, as vLLM names it
        assert response.json()["error"]["message"] == f"{field} must be at most 10, got 11."
    response = capped.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 11})
    assert response.status_code == 400
    assert fake_llm.requests == []


def test_the_cap_is_the_budget_of_requests_that_set_none(capped: TestClient, fake_llm: FakeLLM) -> None:
    assert capped.post(CHAT, json={"messages": HI}).status_code == 200
    assert capped.post(CHAT, json={"messages": HI, "max_tokens": 10}).status_code == 200
    assert capped.post(CHAT, json={"messages": HI, "max_tokens": 3}).status_code == 200
    assert [r.sampling.max_tokens for r in fake_llm.requests] == [10, 10, 3]


def test_a_default_budget_over_the_cap_is_cut_to_it(raw_args: dict[str, Any], services: Services) -> None:
    services.args = parse_app_args(raw_args | {"limits": raw_args["limits"] | {"max_tokens": 8}})
    client = TestClient(create_app(services))
    for body in ({"prompt": "Hi"}, {"prompt": "Hi", "max_tokens": None}):  # completions' 16, not asked for
        assert client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 8


def test_without_a_cap_the_budget_is_what_the_context_leaves(client: TestClient, fake_llm: FakeLLM) -> None:
    assert client.post(CHAT, json={"messages": HI}).status_code == 200
    (request,) = fake_llm.requests
    assert request.sampling.max_tokens == 128 - len(request.prompt_token_ids)


def test_limits_have_safe_defaults() -> None:
    limits = LimitsConfig()
    assert (limits.max_n, limits.max_logprobs, limits.max_prompts_per_request) == (16, 20, 64)
    assert limits.max_request_bytes == 32 * 2**20
    assert limits.max_tokens is None  # bounded by the context (model.max_model_len) instead


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [("limits", "max_tokens", 0), ("limits", "max_n", 10_000), ("limits", "max_request_bytes", 10),
     ("auth", "max_concurrent_per_key", -1)],
)  # fmt: skip
def test_out_of_range_limits_fail_naming_the_field(
    raw_args: dict[str, Any], section: str, field: str, value: int
) -> None:
    with pytest.raises(ValueError, match=rf"{section}\.{field}"):
        parse_app_args(raw_args | {section: {field: value}})


def test_trust_remote_code_is_off_unless_configured(app_args: AppArgs) -> None:
    assert app_args.model.trust_remote_code is False
    assert ModelConfig(path="x", max_model_len=16).trust_remote_code is False
    assert ModelConfig(path="x", max_model_len=16, trust_remote_code=True).trust_remote_code is True
