"""serve_app/ingress/middleware/auth.py: optional bearer-token API keys in front of every route but /health."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from serve_app.config import AdmissionConfig, AuthConfig, parse_app_args
from serve_app.errors import OpenAIError, error_response
from serve_app.ingress.app import create_app
from serve_app.ingress.middleware.auth import ApiKeyAuth, load_keys
from serve_app.ingress.pipeline.services import Services
from serve_app.strict_args import ConfigError

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


def test_every_route_but_health_needs_a_key(secured: TestClient) -> None:
    routes = [
        (route.path, method)
        for route in secured.app.routes  # type: ignore[attr-defined]
        for method in getattr(route, "methods", None) or ["GET"]
    ]
    assert {"/v1/chat/completions", "/v1/audio/speech", "/openapi.json", "/docs", "/metrics"} <= {p for p, _ in routes}
    for path, method in routes:
        response = secured.request(method, path, json={})
        if path == "/health":
            assert response.status_code != 401
        else:
            assert response.status_code == 401, (method, path)
            assert method == "HEAD" or response.json()["error"]["code"] == "invalid_api_key"


def test_keys_never_appear_in_logs(secured: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secured.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer yaml-key-wrong"})
    secured.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer yaml-key"})
    secured.post("/v1/chat/completions", json={"bad": 1}, headers={"Authorization": "Bearer env-key-1"})
    assert caplog.records  # something was logged, and none of it is a key
    for secret in ("yaml-key", "env-key-1", "env-key-2"):
        assert secret not in caplog.text


def _app_with_limit(limit: int | None, retry_after_s: int = 1) -> tuple[ApiKeyAuth, asyncio.Event]:
    release = asyncio.Event()

    async def slow_stream(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await release.wait()  # the stream stays open until the test lets it finish
        await send({"type": "http.response.body", "body": b"last"})

    def render(error: OpenAIError) -> Response:  # as the app does: with the config's `admission:`
        return error_response(error, AdmissionConfig(retry_after_s=retry_after_s))

    return ApiKeyAuth(slow_stream, [b"k1", b"k2"], max_concurrent_per_key=limit, render=render), release


async def _call(app: ApiKeyAuth, key: str) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {"type": "http", "path": "/v1/chat/completions", "headers": [(b"authorization", f"Bearer {key}".encode())]}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], dict(sent[0].get("headers", [])), body


async def test_concurrent_requests_per_key_are_limited_for_the_whole_stream() -> None:
    app, release = _app_with_limit(2, retry_after_s=3)
    streams = [asyncio.create_task(_call(app, "k1")) for _ in range(2)]
    await asyncio.sleep(0.01)  # both streams have started and hold their slots
    status, headers, body = await _call(app, "k1")
    assert (status, headers[b"retry-after"]) == (429, b"3")
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("RateLimitError", "too_many_concurrent_requests")
    assert "k1" not in body.decode()
    other = asyncio.create_task(_call(app, "k2"))  # another key has its own slots
    await asyncio.sleep(0.01)
    assert not other.done()
    release.set()
    assert [(await task)[0] for task in [*streams, other]] == [200, 200, 200]
    assert (app.in_flight.count(0), app.in_flight.count(1)) == (0, 0)
    assert (await _call(app, "k1"))[0] == 200  # slots are given back when a stream ends


async def test_no_concurrency_limit_by_default() -> None:
    app, release = _app_with_limit(None)
    streams = [asyncio.create_task(_call(app, "k1")) for _ in range(20)]
    await asyncio.sleep(0.01)
    release.set()
    assert {(await task)[0] for task in streams} == {200}


def test_the_limit_is_read_from_the_config(raw_args: dict[str, Any]) -> None:
    args = parse_app_args(raw_args | {"auth": {"api_keys": ["a"], "max_concurrent_per_key": 3}})
    assert args.auth.max_concurrent_per_key == 3
    assert parse_app_args(raw_args).auth.max_concurrent_per_key is None
    with pytest.raises(ConfigError, match=r"auth\.max_concurrent_per_key"):
        parse_app_args(raw_args | {"auth": {"max_concurrent_per_key": 0}})
