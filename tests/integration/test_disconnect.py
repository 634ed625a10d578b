"""A client that goes away mid-stream aborts its request in the engine (the limits-app's, whose long
context lets a generation outlast the test on any engine)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.support import LONG, TEXT_MODEL, wait_for


def generated_tokens(url: str) -> float:
    """The text engine's own count of the tokens it generated (vLLM's metric: per step, aborted requests too)."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:generation_tokens_total{") and f'model_name="{TEXT_MODEL}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no vllm:generation_tokens_total of {TEXT_MODEL} in /metrics")


def test_disconnect_aborts_in_engine(limits_url: str, limits_llm: Any) -> None:
    before = generated_tokens(limits_url)
    with httpx.stream("POST", f"{limits_url}/v1/chat/completions", json={**LONG, "stream": True},
                      timeout=60) as response:  # fmt: skip
        lines = response.iter_lines()
        first = next(lines)
        assert first.startswith("data: "), first  # the first chunk: the engine is generating
        unfinished = limits_llm.num_unfinished_requests.remote().result()
        assert unfinished == 1, f"first event {first}; then {[line for line in lines if line][:6]}"
    wait_for(lambda: limits_llm.num_unfinished_requests.remote().result() == 0, 30,
             "the engine to end the disconnected request")  # fmt: skip
    # Ended by the abort, not by generating all it was asked for.
    assert generated_tokens(limits_url) - before < LONG["max_tokens"]
