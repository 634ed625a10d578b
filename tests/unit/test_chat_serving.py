"""serve_app/ingress/chat/serving.py through the app: `/v1/chat/completions` with FakeLLM."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.unit.conftest import FAKE_EXPANDED, FAKE_TOKEN_ID

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]
TOP2 = [{"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -1.5, "bytes": [98]}]


def test_non_streaming_response(client: TestClient, fake_llm: Any, chat_ids: Any) -> None:
    response = client.post(CHAT, json={"model": "tiny-chat", "messages": MESSAGES, "max_tokens": 4, "n": 2})
    assert response.status_code == 200
    body = response.json()
    prompt_ids = chat_ids(MESSAGES)
    assert body["id"].startswith("chatcmpl-")
    assert (body["object"], body["model"]) == ("chat.completion", "tiny-chat")
    assert isinstance(body["created"], int)
    assert body["choices"] == [
        {
            "index": i,
            "message": {"role": "assistant", "content": "aaaa"},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        for i in range(2)
    ]
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 8,
        "total_tokens": len(prompt_ids) + 8,
    }
    [request] = fake_llm.requests
    assert request.prompt_token_ids == prompt_ids
    assert request.request_id == body["id"]
    assert (request.sampling.max_tokens, request.sampling.n, request.sampling.logprobs) == (4, 2, None)
    assert float(response.headers["x-tokenizer-time"]) >= 0
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-tokenizer-time"])
    assert "x-llm-first-chunk-time" in response.headers


def test_sampling_fields_reach_the_llm(client: TestClient, fake_llm: Any) -> None:
    body = {
        "messages": MESSAGES,
        "max_completion_tokens": 2,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 7,
        "stop": "\n",
        "stop_token_ids": [2],
        "min_tokens": 1,
        "ignore_eos": True,
    }
    assert client.post(CHAT, json=body).status_code == 200
    spec = fake_llm.requests[0].sampling
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.top_k, spec.seed) == (2, 0.5, 0.9, 5, 7)
    assert (spec.stop, spec.stop_token_ids, spec.min_tokens, spec.ignore_eos) == (["\n"], [2], 1, True)


def test_max_tokens_defaults_to_the_room_left(client: TestClient, fake_llm: Any, chat_ids: Any) -> None:
    body = client.post(CHAT, json={"messages": MESSAGES}).json()
    room = 128 - len(chat_ids(MESSAGES))
    assert fake_llm.requests[0].sampling.max_tokens == room
    assert body["choices"][0]["message"]["content"] == "a" * room
    assert body["usage"]["completion_tokens"] == room


def test_truncation_is_applied(client: TestClient, fake_llm: Any, chat_ids: Any) -> None:
    body = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1, "truncate_prompt_tokens": 5}).json()
    assert fake_llm.requests[0].prompt_token_ids == chat_ids(MESSAGES)[-5:]
    assert body["usage"]["prompt_tokens"] == 5


def test_generation_prompt_off(client: TestClient, fake_llm: Any, chat_ids: Any) -> None:
    client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1, "add_generation_prompt": False})
    assert fake_llm.requests[0].prompt_token_ids == chat_ids(MESSAGES, add_generation_prompt=False)


def test_text_parts(client: TestClient, fake_llm: Any, chat_ids: Any) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there!"}]
    client.post(CHAT, json={"messages": [{"role": "user", "content": parts}], "max_tokens": 1})
    assert fake_llm.requests[0].prompt_token_ids == chat_ids([{"role": "user", "content": "Hello\nthere!"}])


def test_logprobs(client: TestClient, fake_llm: Any) -> None:
    body = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2, "logprobs": True, "top_logprobs": 2})
    assert fake_llm.requests[0].sampling.logprobs == 2
    token = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": TOP2}
    assert body.json()["choices"][0]["logprobs"] == {"content": [token, token]}


def test_logprobs_without_top(client: TestClient, fake_llm: Any) -> None:
    body = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1, "logprobs": True}).json()
    assert fake_llm.requests[0].sampling.logprobs == 0
    assert body["choices"][0]["logprobs"] == {
        "content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
    }


def test_streaming(client: TestClient, sse_events: Any, chat_ids: Any) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = client.post(CHAT, json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert float(response.headers["x-tokenizer-time"]) >= 0
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert {(c["object"], c["model"]) for c in chunks} == {("chat.completion.chunk", "tiny-chat")}
    roles = [c["choices"] for c in chunks[:2]]
    assert roles == [
        [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        for i in range(2)
    ]
    content = chunks[2:-1]
    assert len(content) == 6
    for i in range(2):
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == i]
        assert [m["delta"] for m in mine] == [{"content": "a"}] * 3
        assert [m["finish_reason"] for m in mine] == [None, None, "length"]
        assert ["stop_reason" in m for m in mine] == [False, False, True]
        assert all("usage" not in c for c in content)
    prompt = len(chat_ids(MESSAGES))
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 6,
        "total_tokens": prompt + 6,
    }


def test_streaming_without_usage(client: TestClient, sse_events: Any) -> None:
    events = sse_events(client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2, "stream": True}).text)
    assert len(events) == 1 + 2 + 1  # role, two tokens, [DONE]
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "aa"


def test_streaming_continuous_usage(client: TestClient, sse_events: Any, chat_ids: Any) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = sse_events(client.post(CHAT, json=body).text)
    prompt = len(chat_ids(MESSAGES))
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [0, 1, 2, 2]  # the role's chunk: 0
    assert {e["usage"]["prompt_tokens"] for e in events[:-1]} == {prompt}


def test_continuous_usage_needs_include_usage(client: TestClient, sse_events: Any) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    events = sse_events(client.post(CHAT, json=body).text)
    assert [e for e in events if "usage" in e] == []  # as vLLM: only together with include_usage


def test_streaming_logprobs(client: TestClient, sse_events: Any) -> None:
    body = {"messages": MESSAGES, "max_tokens": 1, "stream": True, "logprobs": True, "top_logprobs": 2}
    events = sse_events(client.post(CHAT, json=body).text)
    assert events[1]["choices"][0]["logprobs"] == {
        "content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": TOP2}]
    }


def test_return_token_ids(client: TestClient, fake_llm: Any, sse_events: Any, chat_ids: Any) -> None:
    # vLLM's extension: the prompt's ids as the engine has them beside the choices, each choice's generated ids.
    body = {"messages": MESSAGES, "max_tokens": 2, "n": 2, "return_token_ids": True}
    answer = client.post(CHAT, json=body).json()
    assert fake_llm.requests[0].sampling.return_prompt_ids
    engine_ids = [*chat_ids(MESSAGES), FAKE_EXPANDED]  # the engine's, not the tokenizer's (images expanded)
    assert answer["prompt_token_ids"] == engine_ids
    assert [c["token_ids"] for c in answer["choices"]] == [[FAKE_TOKEN_ID] * 2] * 2
    events = sse_events(client.post(CHAT, json={**body, "stream": True}).text)[:-1]
    openings, deltas = events[:2], events[2:]
    assert [e["prompt_token_ids"] for e in openings] == [engine_ids] * 2  # with each choice's opening chunk
    assert [e["choices"][0]["token_ids"] for e in deltas] == [[FAKE_TOKEN_ID]] * 4
    assert not any("prompt_token_ids" in e for e in deltas)
    plain = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]  # only when asked
    assert not fake_llm.requests[-1].sampling.return_prompt_ids
