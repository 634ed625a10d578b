"""The engine's processes in a session of their own (`serve_app/stages/engine_session.py`)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib.metadata import entry_points

import pytest

from serve_app.stages.engine_session import AUTOGROUP_NICE, GRACE_S, asked_by
from tests.processes import autogroup, running


@pytest.mark.parametrize(
    ("value", "parent", "expected"),
    [
        ("20", 20, True),  # the engine core, a child of the replica that asked
        (None, 20, False),  # nobody asked (`vllm serve`)
        ("", 20, False),  # the replica asked not to (`engine.own_session: false`)
        ("20", 30, False),  # a worker of the engine core: its parent is the core
        ("20", 1, False),  # a core whose replica is gone (reparented)
    ],
)
def test_who_detaches(value: str | None, parent: int, expected: bool) -> None:
    assert asked_by(value, parent) is expected


def test_vllm_finds_the_plugins() -> None:
    found = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "serve_app.stages.engine_session:detach" in found


# The replica -> engine core -> worker chain, each started as vLLM starts them; the replica asks (or
# not), both engine processes run the plugin as vLLM does, then report their pid and session. The
# core reports a SIGTERM and ignores it (a shutdown that hangs); the worker dies of it.
WORKER = "from serve_app.stages.engine_session import detach; import os, time; detach(); " \
         "print('worker', os.getpid(), os.getsid(0), flush=True); time.sleep(600)"  # fmt: skip
CORE = "from serve_app.stages.engine_session import detach; import os, signal, subprocess, sys, time; " \
       "signal.signal(signal.SIGTERM, lambda *_: print('term', os.getpid(), 0, flush=True)); detach(); " \
       f"subprocess.Popen([sys.executable, '-c', {WORKER!r}]); " \
       "print('core', os.getpid(), os.getsid(0), flush=True); time.sleep(600)"  # fmt: skip
REPLICA = "from serve_app.stages.engine_session import request_own_session; import subprocess, sys, time; " \
          f"request_own_session(sys.argv[1] == 'ask'); subprocess.Popen([sys.executable, '-c', {CORE!r}]); " \
          "time.sleep(600)"  # fmt: skip


class Reports:
    """`role pid session` lines from the processes' shared stdout, read from the raw pipe (a buffered
    reader would hide a second line from `select`)."""

    def __init__(self, fd: int) -> None:
        self._fd, self._pending = fd, b""
        self.seen: dict[str, tuple[int, int]] = {}

    def wait_for(self, role: str, timeout_s: float) -> tuple[int, int]:
        deadline = time.monotonic() + timeout_s
        while role not in self.seen:
            assert select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))[0], (role, self.seen)
            chunk = os.read(self._fd, 4096)
            assert chunk, (role, self.seen)
            *lines, self._pending = (self._pending + chunk).split(b"\n")
            for line in lines:
                name, pid, session = line.decode().split()
                self.seen[name] = (int(pid), int(session))
        return self.seen[role]


@contextmanager
def replica_with_engine(ask: bool) -> Iterator[tuple[subprocess.Popen[bytes], Reports]]:
    """A replica (a process group leader, as Ray starts them) and its engine, all killed at the end."""
    replica = subprocess.Popen([sys.executable, "-c", REPLICA, "ask" if ask else "no"], stdout=subprocess.PIPE,
                               process_group=0)  # fmt: skip
    assert replica.stdout is not None
    reports = Reports(replica.stdout.fileno())
    try:
        reports.wait_for("core", 60)
        reports.wait_for("worker", 60)
        yield replica, reports
    finally:
        with suppress(ProcessLookupError):
            os.killpg(replica.pid, signal.SIGKILL)  # the replica, and an engine that stayed in its group
        for role in ("core", "worker"):
            if role in reports.seen:
                with suppress(ProcessLookupError):
                    os.kill(reports.seen[role][0], signal.SIGKILL)
        replica.wait()


def test_the_engine_gets_a_session_and_ends_with_its_replica() -> None:
    with replica_with_engine(ask=True) as (replica, reports):
        (core, core_session), (worker, worker_session) = reports.seen["core"], reports.seen["worker"]
        assert core_session == core != os.getsid(replica.pid)
        assert worker_session == core  # the worker stays in its engine core's session (one autogroup)
        assert autogroup(core) == autogroup(worker) != autogroup(replica.pid)
        assert autogroup(core).endswith(f" nice {AUTOGROUP_NICE}")  # yields to the rest of the graph
        os.kill(replica.pid, signal.SIGKILL)  # no shutdown: as when a replica is killed or crashes
        killed_at = time.monotonic()
        assert reports.wait_for("term", 10)[0] == core  # first vLLM's own shutdown
        while (running(core) or running(worker)) and time.monotonic() - killed_at < GRACE_S + 10:
            time.sleep(0.05)
        assert not running(core) and not running(worker)  # then SIGKILL, as the core ignored SIGTERM
        assert time.monotonic() - killed_at >= GRACE_S


def test_unasked_the_engine_stays_in_the_replicas_session() -> None:
    with replica_with_engine(ask=False) as (replica, reports):
        assert reports.seen["core"][1] == reports.seen["worker"][1] == os.getsid(replica.pid)
        assert autogroup(reports.seen["core"][0]) == autogroup(replica.pid)
