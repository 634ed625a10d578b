"""A client that goes away mid-stream aborts its request in the engine."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.integration.support import wait_for


def test_disconnect_aborts_in_engine(graph: str, llm_handle: Any) -> None:
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 3000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", f"{graph}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(10)]
        assert all(line.startswith("data: ") or line == "" for line in received)
        assert llm_handle.num_unfinished_requests.remote().result() >= 1
    started = time.monotonic()
    wait_for(lambda: llm_handle.num_unfinished_requests.remote().result() == 0, 10,
             "the engine to abort the disconnected request")  # fmt: skip
    # 3000 tokens take far longer than this on 2 cores; finishing early means it was aborted.
    assert time.monotonic() - started < 10
