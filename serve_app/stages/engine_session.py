"""The engine's processes in a Linux session of their own, so that they cannot starve the front door.

vLLM's engine core and its worker (`mp`, vLLM's only executor on a CPU) wait for each other by spinning
(`sched_yield`, up to a second per wait): under any load the pair keeps about 1.6 of this machine's 2
cores busy. With autogroup scheduling (`kernel.sched_autogroup_enabled=1`, the default of most
distributions) Linux shares the CPU between sessions first and between the processes of a session
second. Started by `make serve` in a terminal, every process of the graph is in that terminal's session,
and the ingress, HAProxy, the health replica and the llm replica queue behind the spinning pair for every
wakeup: on a 2-core AMD EPYC, `/health` p99 under load was 0.2-1.5 s (`vllm serve` beside it: 5-15 ms)
and the graph served 0.48x `vllm serve`'s requests. With the engine in a session of its own, the kernel
gives the rest of the graph its share whenever it asks: `/health` p99 41-70 ms, 0.88-0.92x
(docs/benchmarks.md, 14).

The engine's session then runs at a lower weight (`AUTOGROUP_NICE`): the rest of the graph takes the
CPU first whenever it asks, and the engine everything left. At equal weight the engine also starved
its own front end, the llm replica, which fell behind the engine's outputs: measured with the tiny
model, a 4000-token stream sent its first chunk only after the whole generation (8 s); at nice 5 the
same stream arrived in ~900 chunks from 0.05 s on, in 13-15 s (one session with the graph: 15 s).

Since the engine core runs its model worker itself (`engine.executor_backend: uni`, the llm stage), the
engine is one process whose wait is a blocking read, not a spin: it keeps about 0.8 of a core busy under
load where the two `mp` processes kept 1.6 (docs/benchmarks.md, section 19, `uni`).

How: the llm stage puts its own pid in `ENV` before it builds the engine (`request_own_session`).
`detach` is a vLLM general plugin (entry point `vllm.general_plugins`), which vLLM runs in each process
it spawns (inside a Ray actor it always spawns; a `VLLM_PLUGINS` allowlist without it turns it off);
it acts only in a child of that pid, the engine core, which logs that it did.
The workers the engine core starts after that share its session. `setsid` also takes the engine out of
its replica's process group, which Ray signals when the replica dies; so the engine core watches its
replica and, once it is gone, ends its own group as Ray would have: SIGTERM (vLLM's shutdown), then
SIGKILL after `GRACE_S`.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time

from serve_app import autogroup

ENV = "SERVE_GRAPH_ENGINE_SESSION_OF"
GRACE_S = 2.0
# The nice value of the engine's autogroup: a weight of 335 against the graph's 1024 (nice 0).
AUTOGROUP_NICE = 5

# A child of vLLM's logger: printed, as vLLM's own lines are, in the replica's log.
logger = logging.getLogger("vllm.serve_graph.engine_session")


def request_own_session(enabled: bool) -> None:
    """In the llm replica, before the engine starts: ask (or not) for the engine's own session."""
    os.environ[ENV] = str(os.getpid()) if enabled else ""


def asked_by(value: str | None, parent: int) -> bool:
    """Whether `parent` asked for this process's own session (`value`: `ENV` here): true only in the
    replica's direct children, not in the replica itself nor in the engine core's workers."""
    return value == str(parent)


def detach() -> None:
    """vLLM general plugin: move the engine core into a session of its own (see the module's doc)."""
    replica = os.getppid()
    if not asked_by(os.environ.get(ENV), replica):
        return
    try:
        handle = os.pidfd_open(replica)
    except OSError as exc:  # no pidfd (old kernel, a sandbox's filter) or the replica already gone
        logger.warning("engine core %d stays in its replica's session: %s", os.getpid(), exc)
        return
    if os.getppid() != replica:  # the replica ended before the handle was opened: an engine for no one
        raise SystemExit(f"replica {replica} ended before its engine core started")
    os.setsid()
    yield_to_the_graph()
    threading.Thread(target=_end_with, args=(handle,), name="end-with-replica", daemon=True).start()
    logger.info("engine core %d in a session of its own; it ends with replica %d", os.getpid(), replica)


def yield_to_the_graph() -> None:
    """Lower the weight of this process's (new) autogroup; the workers started after it share it."""
    try:
        autogroup.set_nice(AUTOGROUP_NICE)
    except OSError as exc:  # a kernel without autogroups: sessions do not matter to its scheduler
        logger.warning("engine core %d keeps its session's weight: %s", os.getpid(), exc)


def _end_with(replica: int) -> None:
    """Wait for the process behind the pidfd `replica` to exit, then end this process group."""
    poller = select.poll()
    poller.register(replica, select.POLLIN)
    poller.poll()  # readable once the process has exited
    os.killpg(0, signal.SIGTERM)
    time.sleep(GRACE_S)
    os.killpg(0, signal.SIGKILL)
