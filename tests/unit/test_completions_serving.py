"""serve_app/ingress/completions/serving.py through the app: `/v1/completions` with FakeLLM."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.errors import BadRequestError, StageUnavailableError
from serve_app.ingress.completions.protocol import CompletionRequest
from serve_app.ingress.completions.serving import create_completion
from serve_app.messages import GenerationChunk
from tests.unit.conftest import FAKE_EXPANDED, FAKE_TOKEN_ID

COMPLETIONS = "/v1/completions"


@pytest.fixture
def ids_decoded(services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer's `detokenize` gives "[id]" a token: what was decoded, and from which ids, shows."""

    async def decoded(token_ids: list[int]) -> str:
        return "".join(f"[{t}]" for t in token_ids)

    monkeypatch.setattr(services.tokenizer, "detokenize", decoded)


def test_single_prompt(client: TestClient, fake_llm: Any, hf_tokenizer: Any) -> None:
    response = client.post(COMPLETIONS, json={"model": "tiny-chat", "prompt": "Once upon a time", "max_tokens": 3})
    assert response.status_code == 200
    body = response.json()
    prompt_ids = hf_tokenizer.encode("Once upon a time")
    assert body["id"].startswith("cmpl-")
    assert (body["object"], body["model"]) == ("text_completion", "tiny-chat")
    assert body["choices"] == [
        {"index": 0, "text": "aaa", "logprobs": None, "finish_reason": "length", "stop_reason": None}
    ]
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 3,
        "total_tokens": len(prompt_ids) + 3,
    }
    [request] = fake_llm.requests
    assert (request.prompt_token_ids, request.request_id) == (prompt_ids, f"{body['id']}-0")
    assert "x-tokenizer-time" in response.headers


def test_list_of_prompts_gives_indices_p_times_n_plus_i(client: TestClient, fake_llm: Any, hf_tokenizer: Any) -> None:
    prompts = ["Hello", "A longer prompt than the first one"]
    body = client.post(COMPLETIONS, json={"prompt": prompts, "n": 2, "max_tokens": 2}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == ["aa"] * 4
    prompt_tokens = sum(len(hf_tokenizer.encode(p)) for p in prompts)
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 8,
        "total_tokens": prompt_tokens + 8,
    }
    by_id = {r.request_id: r.prompt_token_ids for r in fake_llm.requests}
    assert by_id == {f"{body['id']}-{p}": hf_tokenizer.encode(text) for p, text in enumerate(prompts)}


def test_token_id_prompts(client: TestClient, fake_llm: Any) -> None:
    body = client.post(COMPLETIONS, json={"prompt": [5, 6, 7], "max_tokens": 1}).json()
    assert fake_llm.requests[0].prompt_token_ids == [5, 6, 7]
    assert body["usage"]["prompt_tokens"] == 3
    body = client.post(COMPLETIONS, json={"prompt": [[5, 6], [7]], "max_tokens": 1}).json()
    assert sorted(r.prompt_token_ids for r in fake_llm.requests[1:]) == [[5, 6], [7]]
    assert [c["index"] for c in body["choices"]] == [0, 1]


def test_echo(client: TestClient) -> None:
    body = client.post(COMPLETIONS, json={"prompt": ["Hello world", "Bye"], "echo": True, "max_tokens": 2}).json()
    assert [c["text"] for c in body["choices"]] == ["Hello worldaa", "Byeaa"]


def test_echo_gives_a_text_prompt_as_sent_and_decodes_token_ids(
    client: TestClient, services: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def decoded(token_ids: list[int]) -> str:
        return f"<s>{token_ids}"  # what a tokenizer that adds special tokens would give back

    monkeypatch.setattr(services.tokenizer, "detokenize", decoded)
    for prompt, echoed in (["Hello  world", "Bye"], ["Hello  world", "Bye"]), ([[5, 6], [7]], ["<s>[5, 6]", "<s>[7]"]):
        body = {"prompt": prompt, "echo": True, "max_tokens": 1, "truncate_prompt_tokens": 1}  # echoed whole
        assert [c["text"] for c in client.post(COMPLETIONS, json=body).json()["choices"]] == [e + "a" for e in echoed]


def test_max_tokens_defaults_to_16(client: TestClient, fake_llm: Any) -> None:
    assert client.post(COMPLETIONS, json={"prompt": "Hi"}).json()["usage"]["completion_tokens"] == 16
    assert client.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": None}).status_code == 200
    assert [r.sampling.max_tokens for r in fake_llm.requests] == [16, 16]  # null too, as vLLM


def test_logprobs(client: TestClient, fake_llm: Any) -> None:
    body = client.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 2, "logprobs": 2}).json()
    assert fake_llm.requests[0].sampling.logprobs == 2
    assert fake_llm.requests[0].sampling.prompt_logprobs is None  # only with echo: the engine's work
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["a", "a"],
        "token_logprobs": [-0.5, -0.5],
        "top_logprobs": [{"a": -0.5, "b": -1.5}] * 2,
        "text_offset": [0, 1],
    }


@pytest.mark.usefixtures("ids_decoded")
def test_echo_with_logprobs_gives_the_prompts_logprobs_first(client: TestClient, fake_llm: Any) -> None:
    # lm-eval-harness's loglikelihood request: token ids, one token, the prompt's logprobs echoed.
    body = {"prompt": [[5, 6, 7], [8, 9]], "echo": True, "logprobs": 1, "max_tokens": 1}
    first, second = client.post(COMPLETIONS, json=body).json()["choices"]
    assert {r.sampling.prompt_logprobs for r in fake_llm.requests} == {1}  # as vLLM: `logprobs` a prompt token
    assert (first["text"], second["text"]) == ("[5][6][7]a", "[8][9]a")
    assert first["logprobs"] == {
        "tokens": ["[5]", "<6>", "<7>", "a"],  # the first token decoded; it has no logprob (None, as vLLM)
        "token_logprobs": [None, -1.0, -1.0, -0.5],
        "top_logprobs": [None, {"<6>": -1.0, "a": -0.5}, {"<7>": -1.0, "a": -0.5}, {"a": -0.5}],
        "text_offset": [0, 3, 6, 9],
    }
    assert second["logprobs"]["tokens"] == ["[8]", "<9>", "a"]  # each prompt's own


@pytest.mark.usefixtures("ids_decoded")
def test_echo_with_max_tokens_0_gives_the_prompt_alone(client: TestClient, fake_llm: Any, sse_events: Any) -> None:
    body = {"prompt": [5, 6], "echo": True, "logprobs": 0, "max_tokens": 0}
    answer = client.post(COMPLETIONS, json=body).json()
    assert fake_llm.requests[0].sampling.max_tokens == 1  # one generated, as vLLM, and not returned
    [choice] = answer["choices"]
    assert (choice["text"], choice["logprobs"]["tokens"]) == ("[5][6]", ["[5]", "<6>"])
    assert (choice["finish_reason"], answer["usage"]["completion_tokens"]) == ("length", 1)
    [event, _done] = sse_events(client.post(COMPLETIONS, json={**body, "stream": True}).text)
    assert (event["choices"][0]["text"], event["choices"][0]["logprobs"]) == (choice["text"], choice["logprobs"])
    refused = client.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 0})  # without echo: a 400, as vLLM
    assert refused.status_code == 400 and "max_tokens" in refused.json()["error"]["message"]


@pytest.mark.usefixtures("ids_decoded")
def test_streaming_echo_with_logprobs_for_each_choice(client: TestClient, sse_events: Any) -> None:
    body = {"prompt": [5, 6], "echo": True, "logprobs": 0, "max_tokens": 2, "n": 2, "stream": True}
    events = sse_events(client.post(COMPLETIONS, json=body).text)[:-1]
    for index in (0, 1):
        mine = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["index"] == index]
        assert [m["tokens"] for m in mine] == [["[5]", "<6>", "a"], ["a"]]  # the prompt's with the first only
        assert mine[0]["token_logprobs"][0] is None
        assert mine[1]["text_offset"] == [mine[0]["text_offset"][-1] + 1]  # offsets continue past the prompt


async def test_an_engine_output_without_the_prompts_logprobs_is_an_error_not_a_short_answer(
    services: Any, fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate = fake_llm.generate

    async def without(request: Any) -> AsyncIterator[GenerationChunk]:
        async for chunk in generate(request):
            yield replace(chunk, prompt_logprobs=None)

    monkeypatch.setattr(fake_llm, "generate", without)
    request = CompletionRequest(model="tiny-chat", prompt=[5, 6], echo=True, logprobs=1, max_tokens=1)
    with pytest.raises(RuntimeError, match="no prompt logprobs"):
        await create_completion(services, request)
    assert fake_llm.closed  # and its engine work stopped


def test_streaming(client: TestClient, sse_events: Any, hf_tokenizer: Any) -> None:
    body = {
        "prompt": ["Hello", "Bye now"],
        "n": 2,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = client.post(COMPLETIONS, json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert len(chunks) == 8
    assert {c["object"] for c in chunks} == {"text_completion"}
    for index in range(4):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(m["text"] for m in mine) == "aa"
        assert [m["finish_reason"] for m in mine] == [None, "length"]
    prompt_tokens = len(hf_tokenizer.encode("Hello")) + len(hf_tokenizer.encode("Bye now"))
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 8,
        "total_tokens": prompt_tokens + 8,
    }


def test_streaming_echo_comes_first_once(client: TestClient, sse_events: Any) -> None:
    events = sse_events(
        client.post(COMPLETIONS, json={"prompt": "Hey", "echo": True, "max_tokens": 3, "stream": True}).text
    )
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["Heya", "a", "a"]


def test_streaming_logprob_offsets_continue(client: TestClient, sse_events: Any) -> None:
    events = sse_events(
        client.post(COMPLETIONS, json={"prompt": "Hi", "logprobs": 1, "max_tokens": 3, "stream": True}).text
    )
    offsets = [e["choices"][0]["logprobs"]["text_offset"] for e in events[:-1]]
    assert offsets == [[0], [1], [2]]
    assert events[0]["choices"][0]["logprobs"]["top_logprobs"] == [{"a": -0.5}]


def test_top_logprobs_include_the_sampled_token(client: TestClient) -> None:
    body = client.post(COMPLETIONS, json={"prompt": "Hi", "max_tokens": 1, "logprobs": 0}).json()
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{"a": -0.5}]  # k + 1, as the legacy API


def test_streaming_continuous_usage(client: TestClient, sse_events: Any, hf_tokenizer: Any) -> None:
    texts = ["Hello", "Bye now"]
    options = {"include_usage": True, "continuous_usage_stats": True}
    body: dict[str, Any] = {"prompt": texts, "max_tokens": 2, "stream": True, "stream_options": options}
    events = sse_events(client.post(COMPLETIONS, json=body).text)[:-1]
    prompts = [len(hf_tokenizer.encode(p)) for p in texts]
    for index in (0, 1):
        mine = [e["usage"] for e in events[:-1] if e["choices"][0]["index"] == index]
        assert [(u["prompt_tokens"], u["completion_tokens"]) for u in mine] == [(prompts[index], k) for k in (1, 2)]
    assert events[-1]["usage"]["completion_tokens"] == 4
    body["stream_options"] = {"continuous_usage_stats": True}  # without include_usage: no usage at all
    assert [e for e in sse_events(client.post(COMPLETIONS, json=body).text) if "usage" in e] == []


def test_one_bad_prompt_fails_the_request_and_closes_the_others(client: TestClient, fake_llm: Any) -> None:
    response = client.post(COMPLETIONS, json={"prompt": ["fine", "word " * 200], "max_tokens": 2})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    [started] = fake_llm.requests  # the good prompt's stream was started, then closed
    assert started.request_id.endswith("-0")
    assert fake_llm.closed == [started.request_id]


def test_llm_rejection_of_one_prompt(client: TestClient, fake_llm: Any) -> None:
    fake_llm.error = BadRequestError("n must be 1 when using greedy sampling", param="n")
    response = client.post(COMPLETIONS, json={"prompt": ["a", "b"], "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "n"


async def test_a_failed_echo_closes_the_started_streams(
    services: Any, fake_llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def lost(token_ids: list[int]) -> str:
        raise StageUnavailableError("The tokenizer stage failed during the request.", code="stage_unavailable")

    monkeypatch.setattr(services.tokenizer, "detokenize", lost)  # the tokenizer stage is the session's
    request = CompletionRequest(model="tiny-chat", prompt=[[5, 6], [7]], echo=True, max_tokens=2)  # ids: decoded
    # The raised error's traceback keeps the request's frame, and so its streams, alive: they must have
    # been closed by the code, not by the garbage collector.
    with pytest.raises(StageUnavailableError):
        await create_completion(services, request)
    assert len(fake_llm.requests) == 2
    assert sorted(fake_llm.closed) == sorted(r.request_id for r in fake_llm.requests)


def test_return_token_ids(client: TestClient, sse_events: Any, hf_tokenizer: Any) -> None:
    # vLLM's extension: each choice with its prompt's ids as the engine has them, and its own generated ids.
    prompts = [[*hf_tokenizer.encode(p), FAKE_EXPANDED] for p in ("Hello", "Bye now")]  # the engine's ids
    body: dict[str, Any] = {"prompt": ["Hello", "Bye now"], "max_tokens": 2, "n": 2, "return_token_ids": True}
    choices = client.post(COMPLETIONS, json=body).json()["choices"]
    assert [c["prompt_token_ids"] for c in choices] == [prompts[0], prompts[0], prompts[1], prompts[1]]
    assert [c["token_ids"] for c in choices] == [[FAKE_TOKEN_ID] * 2] * 4
    events = sse_events(client.post(COMPLETIONS, json={**body, "stream": True}).text)[:-1]
    for index in range(4):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert [m.get("prompt_token_ids") for m in mine] == [prompts[index // 2], None]  # in its first chunk only
        assert [m["token_ids"] for m in mine] == [[FAKE_TOKEN_ID]] * 2
    # With echo, as vLLM: the prompt comes back as its ids, and its text is left out.
    echoed = client.post(COMPLETIONS, json={**body, "echo": True}).json()["choices"]
    assert [(c["text"], c["prompt_token_ids"]) for c in echoed][::2] == [("aa", prompts[0]), ("aa", prompts[1])]
    streamed = sse_events(client.post(COMPLETIONS, json={**body, "echo": True, "stream": True}).text)[:-1]
    assert "".join(e["choices"][0]["text"] for e in streamed) == "a" * 8
