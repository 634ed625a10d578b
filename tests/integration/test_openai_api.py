"""The OpenAI API through the real graph, with the official `openai` client."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from ray import serve

from load.graph_launcher import ray_setting
from serve_app.ingress.gate.admin import admin, admin_socket
from tests.integration.support import (
    APP,
    GRAPH_HEALTH_POLL_S,
    TEXT_MODEL,
    TTS_MODEL,
    VISION_MODEL,
    deployment,
    wait_for,
)

MESSAGES = [{"role": "user", "content": "Say something about the standard library."}]


def chat_prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_stages_are_separate_deployments(graph: str) -> None:
    status = serve.status().applications[APP]
    assert status.status == "RUNNING"
    stages = {TEXT_MODEL: ["tokenizer", "llm"], VISION_MODEL: ["multimodal", "tokenizer", "llm"],
              TTS_MODEL: ["tokenizer", "llm", "vocoder"]}  # fmt: skip
    expected = {"ingress"} | {deployment(model, stage) for model, names in stages.items() for stage in names}
    assert set(status.deployments) == expected
    assert all(d.status == "HEALTHY" for d in status.deployments.values())


def test_models(client: Any) -> None:
    models = client.models.list().data  # every model, at the one base URL
    assert [m.id for m in models] == [TEXT_MODEL, VISION_MODEL, TTS_MODEL]
    assert [m.model_extra["capabilities"] for m in models] == [
        ["chat", "completions"], ["chat", "completions", "vision"], ["chat", "completions", "speech"],
    ]  # fmt: skip


def test_chat_completion(client: Any, reference_tokenizer: Any) -> None:
    response = client.chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=7)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert response.usage.prompt_tokens == chat_prompt_tokens(reference_tokenizer, MESSAGES)
    assert 1 <= response.usage.completion_tokens <= 7
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_chat_stream_with_usage(client: Any, reference_tokenizer: Any) -> None:
    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=MESSAGES,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == chat_prompt_tokens(reference_tokenizer, MESSAGES)
    assert text


def test_stream_ends_with_done(graph: str) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{graph}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "x-tokenizer-time" in response.headers
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_n_seed_and_logprobs(client: Any) -> None:
    kwargs: dict[str, Any] = dict(model="tiny-chat", messages=MESSAGES, max_tokens=5, n=3, seed=7,
                                  temperature=1.0, logprobs=True, top_logprobs=2)  # fmt: skip
    first = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    for choice in first.choices:
        content = choice.logprobs.content
        assert len(content) == len(choice.logprobs.content) >= 1
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_stop_string(client: Any) -> None:
    full = client.completions.create(model="tiny-chat", prompt="import os", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    text = full.choices[0].text
    stop = text[len(text) // 2 :][:3]
    assert stop.strip()
    cut = client.completions.create(model="tiny-chat", prompt="import os", max_tokens=12, temperature=0,
                                    stop=[stop], extra_body={"ignore_eos": True})  # fmt: skip
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


def test_completions_list_prompt_and_stream(client: Any, reference_tokenizer: Any) -> None:
    prompts = ["def main():", "class Foo:"]
    response = client.completions.create(model="tiny-chat", prompt=prompts, max_tokens=4, n=2, logprobs=1)
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.usage.prompt_tokens == sum(len(reference_tokenizer.encode(p)) for p in prompts)
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) for c in response.choices)
    stream = client.completions.create(model="tiny-chat", prompt=prompts[0], max_tokens=4, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 4


def test_what_vllm_serve_accepts_the_real_engine_runs(client: Any, reference_tokenizer: Any) -> None:
    # vLLM 0.32's defaults and bounds: 16 tokens for a completion that sets none, top_k 0 for all tokens,
    # a budget past the room the prompt leaves cut to that room, the sampled token among top_logprobs.
    prompt = "word " * 4000
    room = 4096 - len(reference_tokenizer.encode(prompt))
    response = client.completions.create(model="tiny-chat", prompt="import os", echo=True, temperature=0,
                                         extra_body={"ignore_eos": True, "top_k": 0})  # fmt: skip
    assert response.usage.completion_tokens == 16
    assert response.choices[0].text.startswith("import os")
    long = client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=4000, logprobs=0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    assert long.usage.completion_tokens == room == len(long.choices[0].logprobs.top_logprobs)
    assert all(len(top) == 1 for top in long.choices[0].logprobs.top_logprobs)


def test_echo_with_logprobs_scores_a_prompt_as_lm_eval_asks(client: Any, reference_tokenizer: Any) -> None:
    # lm-eval-harness's loglikelihood request (token ids, echo, logprobs 1, one token), on the real engine:
    # the prompt's logprobs are the engine's, so a greedy token appended to the prompt scores as it was sampled.
    ids = reference_tokenizer.encode("The quick brown fox jumps")
    greedy = client.completions.create(model="tiny-chat", prompt=ids, max_tokens=1, logprobs=1, temperature=0,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    sampled = reference_tokenizer.encode(greedy.choices[0].text, add_special_tokens=False)
    scored = client.completions.create(model="tiny-chat", prompt=ids + sampled, max_tokens=0, echo=True, logprobs=1)
    logprobs = scored.choices[0].logprobs
    assert len(logprobs.tokens) == len(ids) + len(sampled) == scored.usage.prompt_tokens  # the prompt alone
    assert (logprobs.token_logprobs[0], logprobs.top_logprobs[0]) == (None, None)  # nothing predicts the first
    assert logprobs.tokens[0] == reference_tokenizer.decode(ids[:1])
    # Each prompt token beside the most likely one at its place, no likelier than it.
    assert all(len(top) <= 2 and max(top.values()) >= lp
               for lp, top in zip(logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True))  # fmt: skip
    assert len(sampled) == 1  # the default model's greedy token here decodes and encodes back alike
    assert logprobs.token_logprobs[-1] == pytest.approx(greedy.choices[0].logprobs.token_logprobs[0], abs=0.05)


def test_return_token_ids_are_the_prompts_and_the_generated(client: Any, reference_tokenizer: Any) -> None:
    # vLLM's extension, on the real engine: the prompt's ids the engine got, and the ids it generated.
    extra = {"ignore_eos": True, "return_token_ids": True}
    text = client.completions.create(model="tiny-chat", prompt="import os", max_tokens=5, extra_body=extra)
    [choice] = text.choices
    assert choice.model_extra["prompt_token_ids"] == reference_tokenizer.encode("import os")
    assert len(choice.model_extra["token_ids"]) == 5
    messages = [{"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=3, extra_body=extra)
    rendered = reference_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat.model_extra["prompt_token_ids"] == reference_tokenizer.encode(rendered, add_special_tokens=False)
    assert len(chat.choices[0].model_extra["token_ids"]) == 3


def test_tokenize_detokenize(graph: str, reference_tokenizer: Any) -> None:
    ids = httpx.post(f"{graph}/tokenize", json={"prompt": "hello world"}, timeout=10).json()
    assert ids["tokens"] == reference_tokenizer.encode("hello world")
    assert ids["max_model_len"] == 4096
    strs = httpx.post(f"{graph}/tokenize", json={"prompt": "hello world", "return_token_strs": True}, timeout=10)
    assert strs.json()["token_strs"] == reference_tokenizer.convert_ids_to_tokens(ids["tokens"])
    text = httpx.post(f"{graph}/detokenize", json={"tokens": ids["tokens"]}, timeout=10).json()
    assert text == {"prompt": "hello world"}


def test_metrics(graph: str, client: Any) -> None:
    client.completions.create(model="tiny-chat", prompt="x", max_tokens=2)
    text = httpx.get(f"{graph}/metrics", timeout=10).text
    assert 'serve_graph_requests_total{endpoint="/v1/completions",status="200"}' in text
    assert 'serve_graph_stage_seconds_count{model="tiny-chat",stage="tokenizer"}' in text
    assert "vllm:" in text


def test_haproxy_runs_the_threads_configs_ray_env_sets(graph: str) -> None:
    # Serve reads RAY_SERVE_HAPROXY_NBTHREAD where its proxy starts; its default is 4.
    (node,) = serve.status().proxies  # `proxy_location: HeadOnly`
    info = asyncio.run(admin(admin_socket(node), "show info\n")).splitlines()
    assert f"Nbthread: {ray_setting('RAY_SERVE_HAPROXY_NBTHREAD')}" in info


def test_a_green_health_is_haproxys_answer_and_a_verbose_one_the_health_apps(graph: str) -> None:
    # HAProxy's answer from the health app's stamp; an HAProxy reload (an earlier test's autoscaling)
    # starts unstamped until the next stamp, half a poll interval later.
    wait_for(lambda: httpx.get(f"{graph}/health", timeout=5).json() == {"status": "ok"}, 2 * GRAPH_HEALTH_POLL_S,
             "HAProxy's own green /health")  # fmt: skip
    verbose = httpx.get(f"{graph}/health?verbose", timeout=5).json()
    assert verbose["status"] == "ok" and verbose["applications"][APP]["status"] == "ok"
