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

import psutil
import pytest

from serve_app.stages.engine_session import ENV, wants_own_session


@pytest.mark.parametrize(
    ("pid", "parent", "group", "session", "asked", "expected"),
    [
        (30, 20, 20, 10, True, True),  # the engine core: in its replica's group and the launcher's session
        (30, 20, 20, 10, False, False),  # the llm stage did not ask (`vllm serve`, own_session: false)
        (20, 10, 20, 10, True, False),  # the replica itself: a group leader, which setsid refuses
        (40, 30, 30, 30, True, False),  # a worker of an engine core that already has its own session
        (30, 20, 30, 30, True, False),  # already a session leader
    ],
)
def test_who_starts_a_session(pid: int, parent: int, group: int, session: int, asked: bool, expected: bool) -> None:
    assert wants_own_session(pid=pid, parent=parent, group=group, session=session, asked=asked) is expected


def test_vllm_finds_the_plugin() -> None:
    found = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "serve_app.stages.engine_session:detach" in found


# The replica -> engine core -> worker chain, each the process vLLM would start; both engine processes
# run the plugin as vLLM does, then report their pid and session.
WORKER = "from serve_app.stages.engine_session import detach; import os, time; detach(); " \
         "print('worker', os.getpid(), os.getsid(0), flush=True); time.sleep(600)"  # fmt: skip
CORE = "from serve_app.stages.engine_session import detach; import os, subprocess, sys, time; detach(); " \
       f"subprocess.Popen([sys.executable, '-c', {WORKER!r}]); " \
       "print('core', os.getpid(), os.getsid(0), flush=True); time.sleep(600)"  # fmt: skip
REPLICA = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {CORE!r}]); time.sleep(600)"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def replica_with_engine(asked: bool) -> Iterator[tuple[subprocess.Popen[str], dict[str, tuple[int, int]]]]:
    """A replica (a process group leader, as Ray starts them) whose engine core and worker have reported
    `{role: (pid, session)}`; every process of it is killed at the end."""
    env = {**os.environ, ENV: "1" if asked else "0"}
    replica = subprocess.Popen([sys.executable, "-c", REPLICA], env=env, stdout=subprocess.PIPE, text=True,
                               process_group=0)  # fmt: skip
    assert replica.stdout is not None
    reported: dict[str, tuple[int, int]] = {}
    try:
        deadline = time.monotonic() + 60
        while len(reported) < 2:
            assert select.select([replica.stdout], [], [], max(0.0, deadline - time.monotonic()))[0], reported
            role, pid, session = replica.stdout.readline().split()
            reported[role] = (int(pid), int(session))
        yield replica, reported
    finally:
        for pid in [replica.pid, *(pid for pid, _ in reported.values())]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        replica.wait()


def test_the_engine_gets_a_session_and_ends_with_its_replica() -> None:
    with replica_with_engine(asked=True) as (replica, reported):
        (core, core_session), (worker, worker_session) = reported["core"], reported["worker"]
        assert core_session == core != os.getsid(replica.pid)
        assert worker_session == core  # the worker stays in its engine core's session (one autogroup)
        os.kill(replica.pid, signal.SIGKILL)  # no shutdown: as when a replica is killed or crashes
        deadline = time.monotonic() + 10
        while (alive(core) or alive(worker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(core) and not alive(worker)


def test_unasked_the_engine_stays_in_the_replicas_session() -> None:
    with replica_with_engine(asked=False) as (replica, reported):
        assert reported["core"][1] == reported["worker"][1] == os.getsid(replica.pid)
