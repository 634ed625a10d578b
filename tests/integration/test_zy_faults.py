"""Faults on the shared graph: a replica killed mid-request, an engine killed mid-stream, a hung engine.

Each test breaks one stage, checks what the client sees (a 503 OpenAI error, or an SSE error event
once a stream has begun, within seconds) and what `/health` says, then waits for Serve to replace the
replica and for a new request to succeed, so the graph is healthy again when it returns. `zy` makes
pytest (which runs files in name order) run these after the other integration tests, so a recovery
that fails cannot fail the rest. Recovery times are printed (`-s`) and are part of the assertion
messages.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psutil
import pytest
from ray._private import state

from tests.integration.support import (
    ALLOWED_LOOPBACK,
    APP,
    GRAPH_HEALTH_POLL_S,
    TEXT_MODEL,
    TTS_MODEL,
    VISION_MODEL,
    WATCHDOG_TIMEOUT_S,
    deployment,
    engine_core_pid,
    graph_healthy,
    health_key,
    health_status,
    stage_health,
    wait_for,
)

# "Within a couple of seconds" of the fault, with room for a loaded 2-core machine.
ERROR_WITHIN_S = 5.0
RECOVERY_TIMEOUT_S = 240.0
# The default health.poll_interval_s (2 s) + health.timeout_s (5 s), which the config keeps, with room.
HEALTH_POLL_WITHIN_S = 10.0


def replica_pids(app: str, deployment: str) -> list[int]:
    return [int(a["Pid"]) for a in state.actors().values()
            if a["ActorClassName"] == f"ServeReplica:{app}:{deployment}" and a["State"] == "ALIVE"]  # fmt: skip


def replica_pid(app: str, deployment: str) -> int:
    [pid] = replica_pids(app, deployment)
    return pid


def wait_recovered(base_url: str, app: str, deployment: str, old_pid: int, since: float) -> float:
    """Seconds from `since` until Serve has a new replica in place of `old_pid` and `/health` is 200."""
    wait_for(lambda: replica_pids(app, deployment) not in ([], [old_pid]) and graph_healthy(base_url),
             RECOVERY_TIMEOUT_S, f"Serve to replace the {app} {deployment} replica")  # fmt: skip
    return time.monotonic() - since


def health_truthful(base_url: str, app: str, stage: str, old_pid: int) -> bool:
    """`/health` names the stage (a deployment, `<model>-<stage>`) broken, or Serve has already replaced its
    replica (green is then true)."""
    broken = stage_health(base_url, app).get(health_key(stage)) != "ok"
    return broken or replica_pids(app, stage) not in ([], [old_pid])


def chat(base_url: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4} | extra
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def record(name: str, **seconds: float) -> str:
    line = f"[faults] {name}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
    print(line)
    return line


def assert_recovers(base_url: str, app: str, stage: str, old_pid: int, killed_at: float, *, model: str,
                    name: str, failed_s: float) -> None:  # fmt: skip
    """After a replica was killed and its request failed: `/health` tells the truth, Serve replaces the
    replica, a new request succeeds, and the error came within ERROR_WITHIN_S (the times are printed)."""
    # The graph's /health (the app at `/`) learns it at its next poll of the ingress.
    wait_for(lambda: health_truthful(base_url, app, stage, old_pid), 3 * GRAPH_HEALTH_POLL_S,
             f"/health to report the {stage}")  # fmt: skip
    red_s = time.monotonic() - killed_at
    recovered_s = wait_recovered(base_url, app, stage, old_pid, killed_at)
    assert chat(base_url, model).status_code == 200
    line = record(name, error_after=failed_s, health_red_after=red_s, recovered_after=recovered_s)
    assert failed_s < ERROR_WITHIN_S, line


def assert_stage_error(response: httpx.Response, code: str, *words: str) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    assert error["type"] == "ServiceUnavailableError"
    for word in words:
        assert word in error["message"], error
    return error


@contextmanager
def in_background(call: Callable[[], httpx.Response]) -> Iterator[Future[httpx.Response]]:
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(call)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def test_zy_tokenizer_killed_mid_request(graph: str) -> None:
    pid = replica_pid(APP, deployment(TEXT_MODEL, "tokenizer"))
    # Several seconds of tokenizing: the replica is certainly inside the call when it dies. (A replica
    # stopped before the call never gets it: Serve's router probes it, waits, and sends the request to
    # the replacement, which answers 200.) Truncated: a prompt this long is otherwise refused on arrival,
    # as one that cannot fit the context, before any tokenizing.
    body = {"model": "tiny-chat", "prompt": "tokenize these words please " * 300_000, "truncate_prompt_tokens": 16}
    idle = cpu_seconds(pid)
    call = lambda: httpx.post(f"{graph}/v1/completions", json=body, timeout=120)  # noqa: E731
    with in_background(call) as future:
        wait_for(lambda: cpu_seconds(pid) > idle + 0.5, 60, "the tokenizer to be busy with the request")
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        response = future.result(timeout=60)
        failed_s = time.monotonic() - killed_at
    assert_stage_error(response, "stage_unavailable", "tokenizer")
    assert_recovers(graph, APP, deployment(TEXT_MODEL, "tokenizer"), pid, killed_at, model="tiny-chat",
                    name="tokenizer killed mid-request", failed_s=failed_s)  # fmt: skip


class _SlowImage(BaseHTTPRequestHandler):
    """Answers after a while: the multimodal replica is busy fetching when it is killed."""

    requested = threading.Event()

    def do_GET(self) -> None:
        type(self).requested.set()
        time.sleep(4)
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def slow_image_url() -> Iterator[str]:
    server = ThreadingHTTPServer((ALLOWED_LOOPBACK, 0), _SlowImage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _SlowImage.requested.clear()
    yield f"http://{ALLOWED_LOOPBACK}:{server.server_address[1]}/slow.jpg"
    server.shutdown()
    server.server_close()


def test_zy_multimodal_killed_mid_image_request(graph: str, slow_image_url: str) -> None:
    vision = graph  # the vision model at the one base URL
    pid = replica_pid(APP, deployment(VISION_MODEL, "multimodal"))
    content = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": slow_image_url}}]
    with in_background(lambda: chat(vision, "tiny-llava", messages=[{"role": "user", "content": content}])) as future:
        assert _SlowImage.requested.wait(30), "the multimodal stage never fetched the image"
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        response = future.result(timeout=60)
        failed_s = time.monotonic() - killed_at
    assert_stage_error(response, "stage_unavailable", "multimodal")
    assert_recovers(vision, APP, deployment(VISION_MODEL, "multimodal"), pid, killed_at, model="tiny-llava",
                    name="multimodal killed mid-request", failed_s=failed_s)  # fmt: skip


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any] | str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            yield data if data == "[DONE]" else json.loads(data)


def read_to_end(events: Iterator[dict[str, Any] | str]) -> tuple[dict[str, Any] | None, float]:
    """The stream's error event (None if it had none) and when the stream ended; it must end with [DONE]."""
    error: dict[str, Any] | None = None
    for event in events:
        if event == "[DONE]":
            return error, time.monotonic()
        if isinstance(event, dict) and "error" in event:
            error = event["error"]
    raise AssertionError("the stream stopped without [DONE]")


def read_until_error(events: Iterator[dict[str, Any] | str]) -> tuple[dict[str, Any], float]:
    error, at = read_to_end(events)
    assert error is not None, "the stream ended without an error event"
    return error, at


def test_zy_vocoder_killed_mid_speech_stream(graph: str) -> None:
    tts = graph  # the speech model at the one base URL
    pid = replica_pid(APP, deployment(TTS_MODEL, "vocoder"))
    body = {"model": "tiny-orpheus", "voice": "tara", "input": "A long enough sentence to speak for a while. " * 4,
            "stream": True, "stream_format": "sse", "response_format": "pcm"}  # fmt: skip
    with httpx.stream("POST", f"{tts}/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = sse_events(response)
        first = next(events)
        assert isinstance(first, dict) and first["type"] == "speech.audio.delta", first
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # No request need fail here (the stream may only pause), so only the ingress's background poll
        # can turn /health red: within one poll interval plus a check's timeout.
        wait_for(lambda: health_truthful(tts, APP, deployment(TTS_MODEL, "vocoder"), pid), HEALTH_POLL_WITHIN_S,
                 "/health to report the dead vocoder")  # fmt: skip
        red_s = time.monotonic() - killed_at
        error, at = read_to_end(events)
    failed_s = at - killed_at
    # Either a call in flight died (an error event naming the stage), or every later chunk went to
    # the replacement once Serve had started it (measured: the stream paused, then completed).
    assert error is None or (error["code"] == "stage_unavailable" and "vocoder" in error["message"]), error
    recovered_s = wait_recovered(tts, APP, deployment(TTS_MODEL, "vocoder"), pid, killed_at)
    speech = httpx.post(f"{tts}/v1/audio/speech", json=body | {"stream": False, "input": "hi"}, timeout=120)
    assert speech.status_code == 200
    line = record(f"vocoder killed mid speech stream ({'error event' if error else 'completed'})",
                  health_red_after=red_s, stream_ended_after=failed_s, recovered_after=recovered_s)  # fmt: skip
    assert error is None or failed_s < ERROR_WITHIN_S, line


def test_zy_engine_killed_mid_stream(graph: str) -> None:
    replica = replica_pid(APP, deployment(TEXT_MODEL, "llm"))
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "count"}], "max_tokens": 4000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{graph}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = sse_events(response)
        # Killed at once: the whole generation takes seconds on a fast engine, and its output arrives
        # in few chunks when the ingress reads slower than the engine writes.
        assert isinstance(next(events), dict)
        os.kill(engine_core_pid(replica), signal.SIGKILL)
        killed_at = time.monotonic()
        error, at = read_until_error(events)
    failed_s = at - killed_at
    assert "engine died" in error["message"], error
    assert error["type"] == "ServiceUnavailableError"
    wait_for(lambda: health_status(graph) == 503, 3 * GRAPH_HEALTH_POLL_S, "/health to report the dead engine")
    assert_recovers(graph, APP, deployment(TEXT_MODEL, "llm"), replica, killed_at, model="tiny-chat",
                    name="engine killed mid-stream", failed_s=failed_s)  # fmt: skip


def test_zy_hung_engine_is_detected_and_replaced(graph: str) -> None:
    vision = graph
    replica = replica_pid(APP, deployment(VISION_MODEL, "llm"))
    core = engine_core_pid(replica)
    os.kill(core, signal.SIGSTOP)  # alive, not progressing
    stopped_at = time.monotonic()
    try:
        with in_background(lambda: chat(vision, "tiny-llava", max_tokens=64)) as future:
            response = future.result(timeout=60)
            failed_s = time.monotonic() - stopped_at
        assert_stage_error(response, "engine_hung", "hung")
        # Refused at once: Serve keeps the replica in rotation until its health check has failed 3 times.
        assert_stage_error(chat(vision, "tiny-llava"), "engine_hung", "hung")
        wait_for(lambda: health_status(vision) == 503, 10, "/health to report the hung engine")
        assert "hung" in stage_health(vision, APP)[health_key(deployment(VISION_MODEL, "llm"))]
        detected_s = time.monotonic() - stopped_at
        recovered_s = wait_recovered(vision, APP, deployment(VISION_MODEL, "llm"), replica, stopped_at)
    finally:
        if psutil.pid_exists(core):
            os.kill(core, signal.SIGKILL)  # a stopped process ignores the SIGTERM of a shutdown
    assert chat(vision, "tiny-llava").status_code == 200
    line = record("engine hung (SIGSTOP)", request_failed_after=failed_s, health_red_after=detected_s,
                  recovered_after=recovered_s)  # fmt: skip
    assert WATCHDOG_TIMEOUT_S <= failed_s < WATCHDOG_TIMEOUT_S + 2 * ERROR_WITHIN_S, line
