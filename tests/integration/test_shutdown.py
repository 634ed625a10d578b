"""Graceful shutdown under load, on a Ray cluster of its own (the shared session graph is left alone).

`load.graph_launcher` serves the text application of the default config on a free port; streams are
started, the launcher gets SIGTERM (what `serve run` and a process manager send), and then every stream
must finish (`[DONE]` after a finish reason) within the grace period of the stages that hold them (the
streams take ~28 s here, the config gives ingress and llm 120 s), and the cluster must leave no process
and no `/dev/shm` file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from deployments.stop import orphaned_shm_files, shm_files
from load.ports import free_port
from tests.integration.support import CONFIG, ROOT, TEXT_MODEL, graph_healthy, wait_for

STREAMS = 3


def stream_outcome(url: str, started: threading.Event, outcomes: list[str]) -> None:
    """Appends how one stream ended: done, error (an SSE error event, then [DONE]), refused, truncated."""
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "count"}], "max_tokens": 2000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    finished = errored = False
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
            if response.status_code != 200:
                outcomes.append(f"refused {response.status_code}")
                return
            for line in response.iter_lines():
                data = line.removeprefix("data: ")
                if not line.startswith("data: "):
                    continue
                started.set()
                if data == "[DONE]":
                    outcomes.append("error" if errored else "done" if finished else "done without a finish reason")
                    return
                event: dict[str, Any] = json.loads(data)
                errored = errored or "error" in event
                finished = finished or any(c.get("finish_reason") for c in event.get("choices", []))
    except httpx.HTTPError as exc:
        outcomes.append(f"truncated: {type(exc).__name__}")
        return
    outcomes.append("truncated: no [DONE]")


def alive(processes: list[psutil.Process]) -> list[str]:
    """The names of those still running (zombies have exited: only their parent has not reaped them yet)."""
    names = []
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE:
                names.append(proc.name())
    return names


def test_sigterm_under_load_ends_streams_cleanly_and_leaves_nothing(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shm_before = shm_files()
    # Not the session cluster's address: the launcher starts a cluster of its own. Serve raises a direct
    # ingress's grace to this drain period + 5 s (35 s by default); at 5 s the streams outlast that floor
    # everywhere, so only the config's own grace for the ingress can keep them open.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5",
    }
    log = (tmp_path / "launcher.log").open("w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "load.graph_launcher", "--config", str(CONFIG), "--app", TEXT_MODEL,
         "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    cluster: list[psutil.Process] = []
    try:
        wait_for(lambda: graph_healthy(url), 240, "the launched graph to be healthy")
        cluster = psutil.Process(launcher.pid).children(recursive=True)
        assert any("EngineCore" in " ".join(p.cmdline()) for p in cluster), [p.name() for p in cluster]
        outcomes: list[str] = []
        started = [threading.Event() for _ in range(STREAMS)]
        threads = [threading.Thread(target=stream_outcome, args=(url, s, outcomes)) for s in started]
        for thread in threads:
            thread.start()
        for event in started:
            assert event.wait(60), "a stream never started"
        assert not outcomes, f"streams ended before the signal: {outcomes}"  # else their drain goes untested
        launcher.send_signal(signal.SIGTERM)
        signalled_at = time.monotonic()
        for thread in threads:
            thread.join(timeout=150)
        streams_ended_s = time.monotonic() - signalled_at
        launcher.wait(timeout=150)
        stopped_s = time.monotonic() - signalled_at
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)  # the process group this test started
            launcher.wait()
        log.close()
    print(
        f"[shutdown] streams {outcomes}: ended {streams_ended_s:.1f} s and the launcher {stopped_s:.1f} s after SIGTERM"
    )
    assert outcomes == ["done"] * STREAMS, (
        f"{outcomes}; launcher log: {(tmp_path / 'launcher.log').read_text()[-3000:]}"
    )
    assert launcher.returncode == 0, (tmp_path / "launcher.log").read_text()[-3000:]
    # The launcher kills what of its cluster outlives ray.shutdown() before it exits: nothing may be left.
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not alive(cluster), 5, "the cluster's processes to exit")
    assert not alive(cluster), f"outlived the launcher: {alive(cluster)}"
    leaked = orphaned_shm_files(shm_before)
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
