"""Admission, deadlines and disconnects on the real graph, against the small-limits application
(`limits-app`: an engine of two sequences and no waiting queue; llm max_ongoing_requests 2,
max_queued_requests 1).

A full stage answers within a fraction of a second with a status, Retry-After and OpenAI JSON, also
for streams (before their first byte); every request ends; a client that goes away or a deadline that
passes frees the engine for the next request."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from tests.integration.support import LONG, wait_for

SHORT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# A refusal, not a wait for a slot: the LONG generations it meets run for a minute or more. How fast a
# refusal is under load is the bench's to measure (load/burst.py); this bound holds on a loaded CI machine.
FAST_S = 2.0


@contextmanager
def generating(url: str, **fields: Any) -> Iterator[None]:
    """A long streamed generation, running until the block ends (then the client goes away)."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**LONG, "stream": True, **fields},
                      timeout=60) as response:  # fmt: skip
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        yield


def assert_rejected(response: httpx.Response, elapsed_s: float) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert elapsed_s < FAST_S, f"rejection took {elapsed_s:.3f} s"
    error: dict[str, Any] = response.json()["error"]
    assert (error["type"], error["code"]) == ("ServiceUnavailableError", "overloaded")
    return error


def timed_post(url: str, body: dict[str, Any], **kwargs: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30, **kwargs)
    return response, time.perf_counter() - start


def test_a_full_engine_refuses_fast_and_a_disconnect_frees_it(limits_url: str, limits_llm: Any) -> None:
    with generating(limits_url, n=2):  # both engine sequences
        assert limits_llm.num_unfinished_requests.remote().result() == 2
        for stream in (False, True):
            response, elapsed = timed_post(limits_url, {**SHORT, "stream": stream})
            error = assert_rejected(response, elapsed)  # a stream too: a status, not a started SSE body
            assert "waiting queue is full" in error["message"]
    # The client went away: the engine aborts its sequences, and the next request is admitted.
    wait_for(lambda: limits_llm.num_unfinished_requests.remote().result() == 0, 10, "the aborted request to end")
    response, _ = timed_post(limits_url, SHORT)
    assert response.status_code == 200


def test_a_full_stage_queue_refuses_fast_and_nothing_hangs(limits_url: str, limits_llm: Any) -> None:
    with ExitStack() as streams, concurrent.futures.ThreadPoolExecutor(1) as pool:
        for _ in range(2):  # the llm deployment's max_ongoing_requests
            streams.enter_context(generating(limits_url))
        queued = pool.submit(timed_post, limits_url, SHORT)  # waits in Serve's queue (max_queued_requests 1)
        # Time to pass the tokenizer stage and reach Serve's queue. Nothing marks that without taking a place
        # in the queue itself (a /metrics scrape asks the llm stage; so would a handle call from here).
        time.sleep(2.0)
        if queued.done():
            response, elapsed = queued.result()
            pytest.fail(f"the queued request ended after {elapsed:.3f} s: {response.status_code} {response.text}")
        response, elapsed = timed_post(limits_url, SHORT)
        error = assert_rejected(response, elapsed)
        assert "llm stage is at capacity" in error["message"]
        streams.close()  # the streams' clients go away; the queued request gets a slot
        response, _ = queued.result(timeout=30)
        assert response.status_code == 200


def test_a_deadline_ends_a_long_generation_and_frees_the_engine(limits_url: str, limits_llm: Any) -> None:
    response, elapsed = timed_post(limits_url, LONG, headers={"X-Request-Timeout": "1"})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    assert 1.0 <= elapsed < 3.0
    wait_for(lambda: limits_llm.num_unfinished_requests.remote().result() == 0, 10, "the engine to drop it")

    with httpx.stream("POST", f"{limits_url}/v1/chat/completions", json={**LONG, "stream": True},
                      headers={"X-Request-Timeout": "1"}, timeout=30) as stream:  # fmt: skip
        assert stream.status_code == 200
        events = [line for line in stream.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert '"code":"deadline_exceeded"' in events[-2]
    wait_for(lambda: limits_llm.num_unfinished_requests.remote().result() == 0, 10, "the engine to drop it")


def test_metrics_show_rejections_ttft_split_and_stage_in_flight(limits_url: str, limits_llm: Any) -> None:
    with generating(limits_url, n=2):
        timed_post(limits_url, SHORT)
        metrics = httpx.get(f"{limits_url}/metrics", timeout=10).text
    assert 'serve_graph_rejections_total{reason="engine_queue_full",stage="llm"}' in metrics
    assert 'serve_graph_stage_in_flight{stage="llm"} 1.0' in metrics
    for part in ("engine", "framework", "total"):
        assert f'serve_graph_ttft_seconds_count{{part="{part}"}}' in metrics
    # The client went away; until the engine has aborted its two sequences, a request is still refused.
    wait_for(lambda: limits_llm.num_unfinished_requests.remote().result() == 0, 10, "the aborted request to end")
    response, _ = timed_post(limits_url, SHORT)
    assert response.status_code == 200, response.text
    assert float(response.headers["x-llm-engine-time"]) > 0
    assert float(response.headers["x-first-token-time"]) >= float(response.headers["x-llm-engine-time"])
