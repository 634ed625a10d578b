"""A client that goes away mid-stream aborts its request in the engine."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.support import TEXT_MODEL, wait_for

MAX_TOKENS = 4000  # of the text model's 4096-token context


def generated_tokens(graph: str) -> float:
    """The text engine's own count of the tokens it generated (vLLM's metric: per step, aborted requests too)."""
    for line in httpx.get(f"{graph}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:generation_tokens_total{") and f'model_name="{TEXT_MODEL}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no vllm:generation_tokens_total of {TEXT_MODEL} in /metrics")


def test_disconnect_aborts_in_engine(graph: str, llm_handle: Any) -> None:
    before = generated_tokens(graph)
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", f"{graph}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        first = next(lines)
        assert first.startswith("data: ")  # the first chunk: the engine is generating
        unfinished = llm_handle.num_unfinished_requests.remote().result()
        assert unfinished == 1, f"first event {first}; then {[line for line in lines if line][:6]}"
    wait_for(lambda: llm_handle.num_unfinished_requests.remote().result() == 0, 30,
             "the engine to end the disconnected request")  # fmt: skip
    # Ended by the abort, not by generating all it was asked for: on a fast engine the whole request
    # takes seconds, so the time it took to end says nothing.
    assert generated_tokens(graph) - before < MAX_TOKENS
