"""serve_app/ingress/auth.py: optional bearer-token API keys in front of every route but /health."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.config import AuthConfig, parse_app_args
from serve_app.ingress.app import create_app
from serve_app.ingress.auth import load_keys
from serve_app.ingress.pipeline import Services

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


@pytest.fixture
def secured(raw_args: dict[str, Any], services: Services, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("TEST_API_KEYS", "env-key-1, env-key-2")
    args = parse_app_args(raw_args | {"auth": {"api_keys": ["yaml-key"], "api_keys_env": "TEST_API_KEYS"}})
    services.args = args
    return TestClient(create_app(services))


@pytest.mark.parametrize("key", ["yaml-key", "env-key-1", "env-key-2"])
def test_each_configured_key_is_accepted(secured: TestClient, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    assert secured.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    assert secured.get("/v1/models", headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "yaml-key"}, {"Authorization": "Basic yaml-key"},
     {"Authorization": "Bearer yaml-key-longer"}, {"Authorization": "Bearer "}],
)  # fmt: skip
def test_missing_or_wrong_keys_are_401(secured: TestClient, headers: dict[str, str]) -> None:
    for response in (
        secured.post("/v1/chat/completions", json=CHAT, headers=headers),
        secured.get("/v1/models", headers=headers),
        secured.get("/metrics", headers=headers),
    ):
        assert response.status_code == 401
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("AuthenticationError", "invalid_api_key")
        assert "yaml-key" not in response.text


def test_health_stays_open(secured: TestClient) -> None:
    assert secured.get("/health").status_code in (200, 503)  # the monitor's state, never 401


def test_no_keys_means_no_auth(client: TestClient) -> None:
    assert client.get("/v1/models").status_code == 200


def test_keys_never_show_in_the_config_repr() -> None:
    config = AuthConfig.model_validate({"api_keys": ["s3cret"]})
    assert "s3cret" not in repr(config) and "s3cret" not in str(config.model_dump())
    assert load_keys(config) == [b"s3cret"]
    assert load_keys(AuthConfig.model_validate({"api_keys_env": "UNSET_VARIABLE_FOR_TEST"})) == []
