"""Client mistakes get OpenAI-shaped 4xx errors over real HTTP, and the graph stays healthy."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

CHAT = "/v1/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "word " * 6000  # ~6k tokens with the tiny tokenizer, over the 4096 context

BAD_REQUESTS: list[tuple[str, Any, int, str | None]] = [
    (CHAT, b"{not json", 400, None),
    (CHAT, {"messages": OK_MESSAGES, "max_tokens": "5"}, 400, "max_tokens"),
    (CHAT, {"messages": OK_MESSAGES, "temperature": -0.5}, 400, "temperature"),
    (CHAT, {"messages": OK_MESSAGES, "top_p": 1.5}, 400, "top_p"),
    (CHAT, {"messages": OK_MESSAGES, "n": 0}, 400, "n"),
    (CHAT, {"messages": OK_MESSAGES, "n": 10_000}, 400, "n"),
    (CHAT, {"messages": OK_MESSAGES, "max_tokens": 100_000}, 400, "max_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    (CHAT, {"messages": OK_MESSAGES, "unknown_field": 1}, 400, "unknown_field"),
    (CHAT, {"messages": OK_MESSAGES, "model": "no-such-model"}, 404, "model"),
    ("/v1/completions", {"prompt": LONG_PROMPT}, 400, "prompt"),
    ("/v1/completions", {"prompt": [10**9]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_bad_request_is_openai_error(graph: str, path: str, body: Any, status: int, param: str | None) -> None:
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = httpx.post(f"{graph}{path}", headers={"content-type": "application/json"}, timeout=30, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["type"] in ("BadRequestError", "NotFoundError")
    if param is not None:
        assert error["param"] == param


def test_streaming_request_rejected_before_first_byte(graph: str) -> None:
    body = {"messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    response = httpx.post(f"{graph}{CHAT}", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_graph_healthy_after_bad_requests(graph: str, client: Any) -> None:
    for path, body, _, _ in BAD_REQUESTS:
        kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        httpx.post(f"{graph}{path}", headers={"content-type": "application/json"}, timeout=30, **kwargs)
    assert httpx.get(f"{graph}/health", timeout=5).status_code == 200
    response = client.chat.completions.create(model="tiny-chat", messages=OK_MESSAGES, max_tokens=2)
    assert response.choices[0].message.content is not None
