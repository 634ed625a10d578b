"""A dead engine, or a dead llm replica, turns `/health` red within seconds; Serve replaces the replica and
the graph recovers. A replica's engine, in a session of its own, ends with it.

It breaks the shared graph, so it waits for Serve to repair it (a new replica that answers) before it
ends: the tests pytest runs after it (files in name order) find a healthy graph.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil
from ray._private import state

from tests.integration.support import (
    APP,
    TEXT_MODEL,
    deployment,
    engine_core_pid,
    health_key,
    health_status,
    stage_health,
    wait_for,
)
from tests.processes import running


def llm_replica_pids() -> list[int]:
    name = f"ServeReplica:{APP}:{deployment(TEXT_MODEL, 'llm')}"
    return [int(a["Pid"]) for a in state.actors().values() if a["ActorClassName"] == name and a["State"] == "ALIVE"]


def llm_replica_pid() -> int:
    (pid,) = llm_replica_pids()
    return pid


def llm_reported_broken(base_url: str) -> bool:
    """The graph's `/health` names this application's llm stage: a 503 alone may be another application's."""
    return stage_health(base_url, APP).get(health_key(deployment(TEXT_MODEL, "llm")), "ok") != "ok"


def test_engine_death_is_reported_and_repaired(graph: str, client: Any) -> None:
    replica = llm_replica_pid()
    os.kill(engine_core_pid(replica), signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: llm_reported_broken(graph), 15, "/health to report the dead engine")
    print(f"\n/health reported the dead engine {time.monotonic() - killed_at:.1f} s after the kill")
    assert health_status(graph) == 503
    wait_for(lambda: health_status(graph) == 200, 180, "Serve to replace the llm replica")
    assert llm_replica_pid() != replica
    response = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2)  # fmt: skip
    assert response.choices[0].message.content is not None


def test_engine_has_its_own_session_and_ends_with_its_replica(graph: str, client: Any) -> None:
    wait_for(lambda: health_status(graph) == 200, 180, "a healthy graph")  # after the test above, too
    replica = llm_replica_pid()
    core = engine_core_pid(replica)
    engine = [core, *(p.pid for p in psutil.Process(core).children(recursive=True))]
    # serve_app/stages/engine_session.py: one session for the engine core and its workers, not the replica's.
    assert {os.getsid(pid) for pid in engine} == {core} != {os.getsid(replica)}
    os.kill(replica, signal.SIGKILL)  # outside the replica's process group, Ray's cleanup would miss the engine
    wait_for(lambda: not any(running(pid) for pid in engine), 15, "the engine to end with its replica")
    wait_for(lambda: health_status(graph) == 503, 15, "/health to report the dead replica")
    wait_for(lambda: llm_replica_pids() not in ([], [replica]), 60, "Serve to start a new llm replica")
    wait_for(lambda: health_status(graph) == 200, 180, "the new llm replica to be healthy")
    response = client.completions.create(model="tiny-chat", prompt="hi", max_tokens=2)
    assert response.choices[0].text is not None
