"""Admission: every request not admitted is an OpenAI error with the configured status (503 or 429) and
Retry-After, before any byte of a stream, and is counted by stage and reason."""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ray.serve.exceptions import BackPressureError

from deployments.handles import HandleLLM, HandleTokenizer
from serve_app.config import AdmissionConfig, AppArgs
from serve_app.errors import OverloadedError, error_response
from serve_app.ingress.app import create_app
from serve_app.ingress.middleware.admission import InFlightLimit
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import GenerateRequest, SamplingSpec, TextPrompt, TokenizeRequest
from serve_app.stages.tokenizer import TokenizerStage
from serve_app.token_channel import Inbox
from tests.unit.conftest import MODEL_NAME, FakeLLM

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def engine_queue_full() -> OverloadedError:
    return OverloadedError("The engine's waiting queue is full.", code="overloaded", stage="llm",
                           reason="engine_queue_full")  # fmt: skip


def rejections(client: TestClient) -> dict[tuple[str, str], float]:
    """serve_graph_rejections_total by (stage, reason), read from /metrics."""
    counts = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("serve_graph_rejections_total{"):
            labels, value = line[len("serve_graph_rejections_total{") :].split("} ")
            pairs = dict(item.split("=") for item in labels.split(","))
            counts[(pairs["stage"].strip('"'), pairs["reason"].strip('"'))] = float(value)
    return counts


def client_with(app_args: AppArgs, tokenizer_stage: TokenizerStage, llm: FakeLLM, **admission: Any) -> TestClient:
    args = app_args.model_copy(update={"admission": AdmissionConfig(**admission)})
    return TestClient(create_app(Services.create(args, tokenizer_stage, llm)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_rejection_is_a_503_with_retry_after_and_json(client: TestClient, fake_llm: FakeLLM, stream: bool) -> None:
    fake_llm.error = engine_queue_full()
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    # A stream is refused with a status, before its first byte: not an SSE body.
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    error = {"message": "The engine's waiting queue is full.", "type": "ServiceUnavailableError", "param": None,
             "code": "overloaded"}  # fmt: skip
    assert response.json()["error"] == error
    assert rejections(client) == {("llm", "engine_queue_full"): 1.0}


@pytest.mark.parametrize("stream", [False, True])
def test_admission_can_answer_429_with_its_own_retry_after(
    app_args: AppArgs, tokenizer_stage: TokenizerStage, fake_llm: FakeLLM, stream: bool
) -> None:
    client = client_with(app_args, tokenizer_stage, fake_llm, status_code=429, retry_after_s=7)
    fake_llm.error = engine_queue_full()
    response = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "stream": stream})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["type"] == "RateLimitError"
    assert response.json()["error"]["code"] == "overloaded"
    assert client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": ""}).status_code == 400  # not a 429


def test_admission_config_bounds() -> None:
    with pytest.raises(ValueError, match="status_code"):
        AdmissionConfig(status_code=500)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_after_s"):
        AdmissionConfig(retry_after_s=-1)


def test_reasons_are_counted_apart(client: TestClient, fake_llm: FakeLLM) -> None:
    fake_llm.error = engine_queue_full()
    client.post("/v1/chat/completions", json=CHAT)
    fake_llm.error = OverloadedError("full", code="overloaded", stage="llm", reason="stage_full")
    client.post("/v1/chat/completions", json=CHAT)
    client.post("/v1/chat/completions", json=CHAT)
    fake_llm.error = None
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert rejections(client) == {("llm", "engine_queue_full"): 1.0, ("llm", "stage_full"): 2.0}


def test_stage_and_reason_survive_pickling() -> None:
    # Ray pickles the error raised in the llm replica back to the ingress.
    error = pickle.loads(pickle.dumps(engine_queue_full()))
    assert (type(error), error.stage, error.reason, error.code) == (OverloadedError, "llm", "engine_queue_full",
                                                                    "overloaded")  # fmt: skip


class FullHandle:
    """A DeploymentHandle whose stage is at its queue limit: every call raises BackPressureError."""

    def __getattr__(self, method: str) -> Any:
        return self

    def options(self, **_: Any) -> FullHandle:
        return self

    def remote(self, *args: Any) -> Any:
        raise BackPressureError(num_queued_requests=4, max_queued_requests=4)


async def test_a_full_stage_behind_a_handle_is_stage_full() -> None:
    with pytest.raises(OverloadedError) as raised:
        await HandleTokenizer(FullHandle()).tokenize(TokenizeRequest(TextPrompt("hi"), True))  # type: ignore[arg-type]
    assert (raised.value.stage, raised.value.reason, raised.value.code) == ("tokenizer", "stage_full", "overloaded")
    request = GenerateRequest("r", [1], SamplingSpec(max_tokens=1))
    with pytest.raises(OverloadedError) as raised:
        await anext(aiter(HandleLLM(FullHandle(), Inbox("127.0.0.1")).generate(request)))  # type: ignore[arg-type]
    assert (raised.value.stage, raised.value.reason) == ("llm", "stage_full")


async def call(app: Any, path: str, root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    """One request through a pure ASGI app: status, headers and body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": root_path + path, "root_path": root_path, "headers": [],
             "query_string": b""}  # fmt: skip
    await app(scope, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


async def test_the_ingress_refuses_generation_requests_beyond_max_in_flight() -> None:
    release = asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"].endswith("/v1/chat/completions"):
            await release.wait()  # a stream in progress: it holds its slot until its last byte
        await send({"type": "http.response.body", "body": b"ok"})

    refused: list[OverloadedError] = []

    def render(error: Any) -> Any:
        refused.append(error)
        return error_response(error, AdmissionConfig(status_code=429, retry_after_s=2))

    limit = InFlightLimit(slow_app, 1, render)
    stream = asyncio.create_task(call(limit, "/v1/chat/completions", root_path="/vision"))
    await asyncio.sleep(0.01)
    status, headers, body = await call(limit, "/v1/completions", root_path="/vision")
    assert (status, headers["retry-after"]) == (429, "2")
    assert json.loads(body)["error"]["code"] == "overloaded"
    assert [(e.stage, e.reason) for e in refused] == [("ingress", "ingress_full")]
    # Probes and other routes are never refused, and the slot frees when the stream ends.
    assert (await call(limit, "/health", root_path="/vision"))[0] == 200
    release.set()
    assert (await stream)[0] == 200
    assert (await call(limit, "/v1/completions"))[0] == 200
    assert limit.in_flight.count() == 0


def test_the_app_takes_max_in_flight_from_the_config(app_args: AppArgs, tokenizer_stage: TokenizerStage,
                                                  fake_llm: FakeLLM) -> None:  # fmt: skip
    client = client_with(app_args, tokenizer_stage, fake_llm, max_in_flight=1)
    limit = next(m for m in client.app.user_middleware if m.cls is InFlightLimit)  # type: ignore[attr-defined]
    assert limit.kwargs["limit"] == 1
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
