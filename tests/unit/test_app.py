"""serve_app/ingress/app.py through FastAPI's TestClient: routes, errors, health and metrics.

The stages are in-process: the real tokenizer stage and `FakeLLM` (conftest.py). The endpoint
bodies are tested in test_chat_serving.py, test_completions_serving.py and test_tokenize_serving.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.errors import EngineDeadError, OverloadedError
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]
ERROR_KEYS = {"message", "type", "param", "code"}
IMAGE = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}


class Wrapper(Exception):
    """Like Ray's RayTaskError when it cannot be an instance of the cause's class."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("wrapped")
        self.cause = cause


def assert_openai_error(response: Any, status: int, error_type: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == ERROR_KEYS
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


BAD_REQUESTS = [
    # (path, JSON body, expected param); the malformed JSON case is a separate test.
    (CHAT, {"messages": HI, "max_tokens": "5"}, "max_tokens"),
    (CHAT, {"messages": HI, "temperature": -1}, "temperature"),
    (CHAT, {"messages": HI, "temperature": 3}, "temperature"),
    (CHAT, {"messages": HI, "top_p": 0}, "top_p"),
    (CHAT, {"messages": HI, "n": 0}, "n"),
    (CHAT, {"messages": HI, "n": 5}, "n"),
    (CHAT, {"messages": HI, "top_k": -2}, "top_k"),
    (CHAT, {"messages": HI, "unknown_field": 1}, "unknown_field"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {}, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages.0.role"),
    (CHAT, {"messages": [{"role": "user"}]}, "messages.0"),
    (CHAT, {"messages": [{"role": "user", "content": [IMAGE]}]}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 200}]}, "messages"),
    (CHAT, {"messages": HI, "max_tokens": 1000}, "max_tokens"),
    (CHAT, {"messages": HI, "max_completion_tokens": 129}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "word " * 200, "max_tokens": 129}, "max_tokens"),  # before the prompt's length
    (CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 6}, "logprobs"),
    (CHAT, {"messages": HI, "top_logprobs": 2}, None),
    (CHAT, {"messages": HI, "truncate_prompt_tokens": 0}, None),
    (CHAT, {"messages": HI, "truncate_prompt_tokens": 129}, "truncate_prompt_tokens"),
    (CHAT, {"messages": HI, "stream_options": {"include_usage": False}}, None),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": []}, None),
    ("/v1/completions", {"prompt": "Hi", "suffix": "x"}, None),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, None),  # 0 only with echo
    ("/v1/completions", {"prompt": "Hi", "best_of": 2}, None),
    ("/v1/completions", {"prompt": [5, 8000]}, "prompt"),
    ("/v1/completions", {"prompt": ["Hi"] * 9}, "prompt"),
    ("/v1/completions", {"prompt": list(range(200))}, "prompt"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/tokenize", {"prompt": "Hi", "messages": HI}, None),
    ("/tokenize", {}, None),
    ("/detokenize", {"tokens": [1, 8000]}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_REQUESTS)
def test_bad_requests_are_400_openai_errors(
    client: TestClient, fake_llm: Any, path: str, body: dict[str, Any], param: str | None
) -> None:
    error = assert_openai_error(client.post(path, json=body), 400, "BadRequestError")
    assert error["param"] == param
    assert fake_llm.requests == []  # rejected before the engine


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 0},
        {"top_k": -1},
        {"stream_options": {}},
        {"top_logprobs": 0},
        {"max_tokens": 128},
        {"n": None, "stream": None, "logprobs": None, "max_completion_tokens": None},
    ],
    ids=["top_k 0", "top_k -1", "empty stream_options", "top_logprobs 0", "max_tokens past the room", "nulls"],
)
def test_what_vllm_accepts_is_accepted(client: TestClient, fake_llm: Any, fields: dict[str, Any]) -> None:
    assert client.post(CHAT, json={"messages": HI, **fields}).status_code == 200
    [request] = fake_llm.requests
    assert request.sampling.max_tokens == 128 - len(request.prompt_token_ids)  # the room: the default, or cut to it


def test_context_errors_carry_their_code(client: TestClient) -> None:
    response = client.post(CHAT, json={"messages": [{"role": "user", "content": "word " * 200}]})
    assert assert_openai_error(response, 400, "BadRequestError")["code"] == "context_length_exceeded"


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.post(CHAT, content=b'{"messages": [', headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400, "BadRequestError")
    assert (error["message"], error["param"], error["code"]) == (
        "The request body is not valid JSON.",
        None,
        400,
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"model": "gpt-4", "messages": HI}),
        ("/v1/completions", {"model": "gpt-4", "prompt": "Hi"}),
        ("/tokenize", {"model": "gpt-4", "prompt": "Hi"}),
        ("/detokenize", {"model": "gpt-4", "tokens": [1]}),
    ],
)
def test_unknown_model_is_404(client: TestClient, path: str, body: dict[str, Any]) -> None:
    error = assert_openai_error(client.post(path, json=body), 404, "NotFoundError")
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    assert error["message"] == "The model `gpt-4` does not exist."


@pytest.mark.parametrize("stream", [False, True])
def test_overloaded_stage_is_503_with_retry_after(client: TestClient, fake_llm: Any, stream: bool) -> None:
    fake_llm.error = OverloadedError("The llm stage is at capacity; retry later.", code="overloaded")
    response = client.post(CHAT, json={"messages": HI, "stream": stream})
    error = assert_openai_error(response, 503, "ServiceUnavailableError")
    assert error["code"] == "overloaded"
    assert response.headers["retry-after"] == "1"


def test_wrapped_error_is_unwrapped(services: Services, fake_llm: Any) -> None:
    fake_llm.error = Wrapper(OverloadedError("busy", code="overloaded"))
    client = TestClient(create_app(services), raise_server_exceptions=False)
    response = client.post(CHAT, json={"messages": HI})
    assert assert_openai_error(response, 503, "ServiceUnavailableError")["message"] == "busy"
    assert response.headers["retry-after"] == "1"
    metrics = client.get("/metrics").text
    assert 'serve_graph_requests_total{endpoint="/v1/chat/completions",status="503"} 1.0' in metrics


def test_unexpected_error_is_500_without_details(services: Services, fake_llm: Any) -> None:
    fake_llm.error = RuntimeError("secret internals")
    client = TestClient(create_app(services), raise_server_exceptions=False)
    response = client.post(CHAT, json={"messages": HI})
    error = assert_openai_error(response, 500, "InternalServerError")
    assert error["message"] == "Internal error: RuntimeError"
    assert "secret" not in response.text
    metrics = client.get("/metrics").text
    assert 'serve_graph_requests_total{endpoint="/v1/chat/completions",status="500"} 1.0' in metrics
    assert 'status="disconnected"' not in metrics


def test_engine_death_is_503_and_turns_health_red(client: TestClient, fake_llm: Any) -> None:
    fake_llm.error = EngineDeadError("The engine died: EngineCore encountered an issue.")
    assert_openai_error(client.post(CHAT, json={"messages": HI}), 503, "ServiceUnavailableError")
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["stages"]["llm"] == "The engine died: EngineCore encountered an issue."


def test_models(client: TestClient, app_args: Any) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert isinstance(card.pop("created"), int)
    assert card == {
        "id": "tiny-chat",
        "object": "model",
        "owned_by": "serve-graph",
        "root": app_args.model.path,
        "max_model_len": 128,
        "capabilities": ["chat", "completions"],
    }


def test_health_is_starting_before_the_first_poll(client: TestClient) -> None:
    response = client.get("/health")  # no lifespan: the monitor has not run
    assert response.status_code == 503
    assert response.json() == {"status": "unhealthy", "stages": {"tokenizer": "starting", "llm": "starting"}}


def test_health_after_polls(services: Services, fake_llm: Any) -> None:
    with TestClient(create_app(services)) as client:  # runs the lifespan: the monitor starts
        assert client.portal is not None
        client.portal.call(services.health.poll_once)
        response = client.get("/health")
        assert (response.status_code, response.json()) == (
            200,
            {"status": "ok", "stages": {"tokenizer": "ok", "llm": "ok"}},
        )
        fake_llm.health_error = RuntimeError("engine down")
        client.portal.call(services.health.poll_once)
        response = client.get("/health")
        assert (response.status_code, response.json()) == (
            503,
            {"status": "unhealthy", "stages": {"tokenizer": "ok", "llm": "RuntimeError: engine down"}},
        )


def test_unknown_route_and_wrong_method_are_openai_errors(client: TestClient) -> None:
    assert_openai_error(client.get("/v1/nope"), 404, "NotFoundError")
    response = client.get(CHAT)
    assert_openai_error(response, 405, "BadRequestError")
    assert response.headers["allow"] == "POST"


def test_metrics(client: TestClient) -> None:
    assert client.post(CHAT, json={"messages": HI, "max_tokens": 3}).status_code == 200
    assert client.post(CHAT, json={"messages": HI, "n": 0}).status_code == 400
    client.get("/nope")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'serve_graph_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in text
    assert 'serve_graph_requests_total{endpoint="/v1/chat/completions",status="400"} 1.0' in text
    assert 'serve_graph_requests_total{endpoint="other",status="404"} 1.0' in text
    assert 'serve_graph_tokens_total{kind="generated"} 3.0' in text
    assert 'serve_graph_stage_seconds_count{stage="tokenizer"} 1.0' in text
    assert 'serve_graph_stage_seconds_count{stage="total"} 2.0' in text
    assert 'serve_graph_requests_in_flight{endpoint="/metrics"} 1.0' in text
    assert "fake_llm_up 1.0" in text


def test_metrics_survive_a_down_llm(client: TestClient, fake_llm: Any) -> None:
    fake_llm.metrics_error = ConnectionError("llm replica gone")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert "serve_graph_requests_total" in response.text
    assert "# llm stage metrics unavailable (tiny-chat): ConnectionError" in response.text


def test_shutdown_closes_in_process_stages_once(services: Services) -> None:
    closed: list[str] = []
    services.closers += [lambda: closed.append("tokenizer"), lambda: closed.append("llm")]
    with TestClient(create_app(services)) as client:
        assert client.get("/v1/models").status_code == 200
        assert closed == []
    assert closed == ["llm", "tokenizer"]
