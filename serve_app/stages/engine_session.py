"""The engine's processes in a Linux session of their own, so that they cannot starve the front door.

vLLM's engine core and its worker wait for each other by spinning (`sched_yield`, up to a second per
wait): under any load the pair keeps about 1.6 of this machine's 2 cores busy. With autogroup
scheduling (`kernel.sched_autogroup_enabled=1`, the default of most distributions) Linux shares the CPU
between sessions first and between the processes of a session second. Started by `make serve` in a
terminal, every process of the graph is in that terminal's session, and the ingress, HAProxy, the
health replica and the llm replica queue behind the spinning pair for every wakeup: on a 2-core AMD
EPYC, `/health` p99 under load was 0.2-1.5 s (`vllm serve` beside it: 5-15 ms) and the graph served
0.48x `vllm serve`'s requests. With the engine in a session of its own, the kernel gives the rest of
the graph its share whenever it asks: `/health` p99 41-70 ms, 0.88-0.92x (docs/benchmarks.md, 14).

The engine's session then runs at a lower weight (`AUTOGROUP_NICE`): the rest of the graph takes the
CPU first whenever it asks, and the engine everything left. At equal weight the engine also starved
its own front end, the llm replica, which fell behind the engine's outputs: measured with the tiny
model, a 4000-token stream sent its first chunk only after the whole generation (8 s); at nice 5 the
same stream arrived in ~900 chunks from 0.05 s on, in 13-15 s (one session with the graph: 15 s).

Within the session the engine's two processes still wait for each other by spinning: vLLM's shared-memory
queue (`SpinCondition.wait`) yields and retries for up to a second after each message before it sleeps on a
socket, so the engine core spins while its worker computes a step and the worker while the core schedules.
With `engine.spin_wait: false`, `nap_between_checks` (a second vLLM general plugin) makes those waits sleep
50 us between checks instead, with the timer slack at 1 us so that a nap is 50 us and not the kernel's
default 50 us more. Offline it costs little and frees CPU (`python -m load.ceiling`, the tiny text model,
bfloat16, AVX-512 AMD: one sequence 473 against 485 tokens/s, 32 at a time 87 against 79 requests/s, the
run's CPU 36 against 42 s). In `make serve` it cost throughput (34 / 12 / 7 % at concurrency 1 / 8 / 32):
a napping engine at nice 5 waits for the graph's processes to give up a core at every wakeup, where a
spinning one already holds it. Hence spinning stays the default. Sleeping on vLLM's notification socket
alone instead of napping hung: the notification can be dropped (its queue holds one), and vLLM relies on
the spin not to wait for it.

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

import ctypes
import logging
import os
import select
import signal
import threading
import time

ENV = "SERVE_GRAPH_ENGINE_SESSION_OF"
NAP_ENV = "SERVE_GRAPH_ENGINE_NAPS"
NAP_S = 50e-6
TIMER_SLACK_NS = 1000
PR_SET_TIMERSLACK = 29  # prctl(2)
GRACE_S = 2.0
# The nice value of the engine's autogroup: a weight of 335 against the graph's 1024 (nice 0).
AUTOGROUP_NICE = 5
AUTOGROUP = "/proc/self/autogroup"

# A child of vLLM's logger: printed, as vLLM's own lines are, in the replica's log.
logger = logging.getLogger("vllm.serve_graph.engine_session")


def request_own_session(enabled: bool) -> None:
    """In the llm replica, before the engine starts: ask (or not) for the engine's own session."""
    os.environ[ENV] = str(os.getpid()) if enabled else ""


def request_naps(enabled: bool) -> None:
    """In the llm replica, before the engine starts: ask (or not) its processes to nap, not spin, in waits
    (`engine.spin_wait: false`)."""
    os.environ[NAP_ENV] = "1" if enabled else ""


def nap_between_checks() -> None:
    """vLLM general plugin: in each engine process (see the module's doc), waits on vLLM's shared-memory
    queue nap instead of spinning, when the llm stage asked for it."""
    if os.environ.get(NAP_ENV) != "1":
        return
    from vllm.distributed.device_communicators import shm_broadcast

    spin_or_sleep = shm_broadcast.SpinCondition.wait

    def wait(self: shm_broadcast.SpinCondition, timeout_ms: int | None = None) -> None:
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(NAP_S)  # vLLM would sched_yield here: a spin
        else:  # idle for a second: vLLM's own wait on its notification socket
            spin_or_sleep(self, timeout_ms)

    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
    shm_broadcast.SpinCondition.wait = wait  # type: ignore[method-assign]
    logger.info("engine process %d naps between checks of its queues", os.getpid())


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
        with open(AUTOGROUP, "w") as group:
            group.write(str(AUTOGROUP_NICE))
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
