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

How: `detach` is a vLLM general plugin (entry point `vllm.general_plugins`, run by every vLLM process
when it starts). It acts only where the llm stage asked for it (`ENV` in the engine's environment)
and only in the engine core: the process whose session leader is neither itself nor its parent. The
workers the engine core starts after that share its session. `setsid` also takes the engine out of
its replica's process group, and Ray ends a dead replica's children by that group; so the engine core
watches its parent and ends its own group (itself and its workers) when the replica is gone.
"""

from __future__ import annotations

import os
import select
import signal
import threading

ENV = "SERVE_GRAPH_ENGINE_OWN_SESSION"


def wants_own_session(*, pid: int, parent: int, group: int, session: int, asked: bool) -> bool:
    """Whether this process should start a session: asked, not the replica (a process group leader,
    which `setsid` refuses), and not a worker of an engine core that already did (its parent leads
    its session)."""
    return asked and group != pid and session not in (pid, parent)


def detach() -> None:
    """vLLM general plugin: move the engine core into a session of its own (see the module's doc)."""
    pid, parent = os.getpid(), os.getppid()
    if not wants_own_session(pid=pid, parent=parent, group=os.getpgid(0), session=os.getsid(0),
                             asked=os.environ.get(ENV) == "1"):  # fmt: skip
        return
    os.setsid()
    end_with_parent(parent)


def end_with_parent(parent: int) -> None:
    """Kill this process's group once `parent` has exited (at once if it already has)."""
    try:
        handle = os.pidfd_open(parent)
    except ProcessLookupError:
        handle = None
    if handle is None or os.getppid() != parent:  # gone before or while the handle was opened
        os.killpg(0, signal.SIGKILL)
        return

    def wait() -> None:
        select.select([handle], [], [])  # readable when the process exits
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=wait, name="end-with-replica", daemon=True).start()
