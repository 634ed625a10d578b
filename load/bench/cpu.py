"""CPU time per request outside the engine, per process role, for every target of a bench run.

What decides how many cores a deployment needs: the engine's CPU is the model's, the rest (HTTP,
Ray Serve's hops, tokenizing, the control plane) is what the serving stack adds. Before and after
each cell the runner reads every process's CPU time (user + system, from load/rss.py's process
table); the difference over the cell's successful requests is CPU per request, and over its wall
time the share of a core.

A target's processes:
- started by `--start`: its process group and every descendant of its main process (the graph
  launcher's Ray cluster descends from it, `vllm serve` and the baseline fork their engine);
- given by URL: the process listening on its port and its descendants. When that process or one of
  its ancestors is Ray's (Serve's proxy, or HAProxy under a Ray worker), every Ray process of the
  machine and their descendants: the GCS, raylet, dashboard and agents serve the graph too, without
  descending from the listener. Two Ray clusters on one machine are then counted together (the
  table warns when it sees more than one Serve controller).

Roles come from process titles: `VLLM::EngineCore` and `VLLM::Worker*` are the engine; Ray names its
workers `ray::ServeReplica:<app>:<deployment>` (role `<app>:<deployment>`, replicas added up),
`ray::ProxyActor`, `ray::ServeController`; `raylet`, `gcs_server`, `haproxy` and Ray's Python
daemons by their command; `vllm serve`'s API server and the baseline by theirs. A process matching
none (a multiprocessing helper, a compile worker) takes its nearest ancestor's role.

A target also spends CPU with no request in flight (Ray's and Serve's own loops, health checks, the
idle replicas of other models): after the last cell the bench reads each target at rest (`at_rest`,
`--rest`; probed on `/health` as in a cell), and each level then shows, besides the CPU per request,
what it spent above that rest per request. Cores a deployment needs outside its engines: its share at
rest plus that times the request rate.

For each process the bench also reads how long its busiest thread of the cell (the one that ran the most
in it) was runnable but waiting for a CPU (`rss.ThreadTimes`, its run-queue delay). That is the thread
doing the process's work: vLLM's engine core stepping, `vllm serve`'s event loop, the thread a Serve
replica's requests run on (not its main thread, Ray's task loop), one of HAProxy's threads. The wait
tells a process starved by its neighbours from one with nothing to do. A process whose threads cannot be
read adds none.

Not counted: CPU of a process that exited during the cell (it is gone by the second reading) and of
children a process reaped (the kernel adds those to the parent's children's times, which would
count a child's whole life in one cell).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil

from load import rss
from load.rss import Proc
from load.stats import fmt_num

ENGINE = "engine"
OUTSIDE = "outside engine"
WAIT = "busiest_thread_wait_share"  # a role's busiest threads' run-queue delay over a cell, per second of it
_MAIN_WAIT = "main_thread_wait_share"  # the same of main threads, in result files of stop 29
_ENGINE_TITLES = ("VLLM::EngineCore", "VLLM::Worker")
_EXECUTABLES = {"raylet": "raylet", "gcs_server": "gcs_server", "haproxy": "haproxy"}
# Command-line markers of the other servers' processes and Ray's Python daemons, first match wins.
_MARKERS = (
    ("VLLM::APIServer", "api_server"),
    ("load.vllm_cli", "api_server"),
    ("vllm serve", "api_server"),
    ("load.baseline", "baseline"),
    ("load.graph_launcher", "launcher"),
    ("dashboard/agent.py", "dashboard_agent"),
    ("runtime_env/agent/main.py", "runtime_env_agent"),
    ("dashboard/dashboard.py", "dashboard"),
    ("log_monitor.py", "log_monitor"),
    ("autoscaler/_private/monitor.py", "autoscaler_monitor"),
)
_RAY_PACKAGE = "/ray/"  # Ray's Python daemons run scripts of the installed package


def _executable(title: str) -> str:
    return os.path.basename(title.split(" ", 1)[0])


def own_role(title: str) -> str | None:
    """The role a process title names, None when it names none."""
    if title.startswith(_ENGINE_TITLES):
        return ENGINE
    if (stage := rss.stage_of(title)) is not None:
        return stage
    if title.startswith("ray::"):
        return "ray_worker"  # an idle worker or an actor that is not Serve's
    if (role := _EXECUTABLES.get(_executable(title))) is not None:
        return role
    return next((role for marker, role in _MARKERS if marker in title), None)


def is_ray(title: str) -> bool:
    return title.startswith("ray::") or _executable(title) in ("raylet", "gcs_server") or _RAY_PACKAGE in title


def role_of(procs: Mapping[int, Proc], pid: int) -> str:
    """The process's own role, else its nearest ancestor's, else `other:<executable>`."""
    for ancestor in rss.lineage(procs, pid):
        if ancestor in procs and (role := own_role(procs[ancestor].title)) is not None:
            return role
    return f"other:{_executable(procs[pid].title)}"


@dataclass(frozen=True)
class Scope:
    """A target's processes: `roots` and their descendants, the members of process group `group`, and
    with `ray`, every Ray process of the machine and their descendants."""

    roots: frozenset[int] = frozenset()
    group: int | None = None
    ray: bool = False

    def describe(self) -> str:
        parts = [f"process group {self.group}"] if self.group is not None else []
        parts.append("descendants of " + ", ".join(map(str, sorted(self.roots))))
        return " + ".join(parts + (["every Ray process of the machine"] if self.ray else []))

    def members(self, procs: Mapping[int, Proc]) -> list[int]:
        found = []
        for pid, p in procs.items():
            chain = rss.lineage(procs, pid)
            if (
                (self.group is not None and p.pgid == self.group)
                or not self.roots.isdisjoint(chain)
                or (self.ray and any(q in procs and is_ray(procs[q].title) for q in chain))
            ):
                found.append(pid)
        return found


def started_scope(pid: int) -> Scope:
    """A `--start` target: `targets.launched` makes its main process the leader of a group of its own."""
    return Scope(frozenset({pid}), group=pid)


Listeners = Callable[[int], set[int]]


def listening_pids(port: int) -> set[int]:
    """The pids with a TCP socket listening on `port` (those this user may see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # some systems show sockets to root only: then no target is found
        return set()
    return {c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}


def url_scope(url: str, procs: Mapping[int, Proc], listeners: Listeners = listening_pids) -> Scope | None:
    """A target given by URL, found by its listening port; None when no process of this machine listens."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    pids = listeners(port)
    if not pids:
        return None
    ray = any(q in procs and is_ray(procs[q].title) for pid in pids for q in rss.lineage(procs, pid))
    return Scope(frozenset(pids), ray=ray)


@dataclass(frozen=True)
class Snapshot:
    at: float  # perf_counter
    procs: dict[int, Proc]


@dataclass(frozen=True)
class RoleCpu:
    cpu_s: float
    processes: int
    wait_s: float | None = None  # its processes' busiest threads' run-queue delay (`busiest_wait`), added up


@dataclass(frozen=True)
class CellCpu:
    """CPU seconds per role of one target's processes over one cell, read `wall_s` apart."""

    wall_s: float
    roles: dict[str, RoleCpu]


def usage(before: Snapshot, after: Snapshot, scope: Scope) -> CellCpu:
    """What each role of the scope's processes spent, and their busiest threads waited for a CPU, between the
    snapshots. A process is the one read before when pid and start time match; one started in between
    counts from zero."""
    cpu: dict[str, float] = {}
    wait: dict[str, float] = {}  # only roles with a process whose wait was read both times (or since it started)
    count: dict[str, int] = {}
    for pid in scope.members(after.procs):
        p = after.procs[pid]
        earlier = before.procs.get(pid)
        base = earlier if earlier is not None and earlier.started == p.started else None
        role = role_of(after.procs, pid)
        cpu[role] = cpu.get(role, 0.0) + p.cpu_s - (base.cpu_s if base is not None else 0.0)
        if (waited := busiest_wait(base, p)) is not None:
            wait[role] = wait.get(role, 0.0) + waited
        count[role] = count.get(role, 0) + 1
    return CellCpu(
        after.at - before.at, {role: RoleCpu(cpu[role], count[role], wait.get(role)) for role in sorted(cpu)}
    )


def busiest_wait(before: Proc | None, after: Proc) -> float | None:
    """The run-queue delay between the readings of `after`'s thread that ran the most between them (a
    thread or process new since counts from zero); None when its threads were not read both times."""
    earlier = {} if before is None else before.threads
    if not after.threads or earlier is None:
        return None
    zero = rss.ThreadTimes(0.0, 0.0)
    # A thread id reused within the process between the readings ran less than nothing: never picked.
    ran_waited = [(t.cpu_s - earlier.get(tid, zero).cpu_s, t.wait_s - earlier.get(tid, zero).wait_s)
                  for tid, t in after.threads.items()]  # fmt: skip
    return max(ran_waited, key=lambda rw: rw[0])[1]


def _list_with_threads() -> list[Proc]:
    return rss.list_processes(threads=True)


class Meter:
    """Reads the process table for the runner and attributes a cell's CPU to its target's scope."""

    def __init__(self, scopes: Mapping[str, Scope], list_procs: Callable[[], list[Proc]] = _list_with_threads) -> None:
        self.scopes = dict(scopes)
        self.list_procs = list_procs

    def snapshot(self) -> Snapshot:
        return Snapshot(time.perf_counter(), {p.pid: p for p in self.list_procs()})

    def measure(self, target: str, before: Snapshot, after: Snapshot) -> CellCpu | None:
        scope = self.scopes.get(target)
        return None if scope is None else usage(before, after, scope)


def at_rest(
    meter: Meter, names: Sequence[str], seconds: float, sleep: Callable[[float], None] = time.sleep
) -> dict[str, CellCpu]:
    """Each named target's CPU over `seconds` in which nothing is sent to it (the names the meter has)."""
    before = meter.snapshot()
    sleep(seconds)
    after = meter.snapshot()
    return {name: cell for name in names if (cell := meter.measure(name, before, after)) is not None}


def meter(
    started: Mapping[str, int], urls: Mapping[str, str], list_procs: Callable[[], list[Proc]] = _list_with_threads,
    listeners: Listeners = listening_pids,
) -> tuple[Meter, list[str]]:  # fmt: skip
    """A meter for the started targets (name -> main pid) and those given by URL, and the names of the
    URL targets that no process of this machine listens for (their CPU cannot be read from here)."""
    procs = {p.pid: p for p in list_procs()}
    found = {name: started_scope(pid) for name, pid in started.items()}
    missing = []
    for name, url in urls.items():
        scope = url_scope(url, procs, listeners)
        if scope is None:
            missing.append(name)
        else:
            found[name] = scope
    return Meter(found, list_procs), missing


def _rest_share(rest: CellCpu, role: str) -> float:
    return rest.roles[role].cpu_s / rest.wall_s if role in rest.roles else 0.0


def pool(cells: Sequence[CellCpu | None], requests: int, rest: CellCpu | None = None) -> dict[str, Any] | None:
    """The cells of one target and level added up: per role, CPU ms per successful request and share
    of a core; `outside_engine_ms_per_request` sums every role but the engine. With the target's `rest`
    (`at_rest`): each role's share of a core at rest, and `above_rest_ms_per_request`, the CPU outside the
    engine beyond what it spends at rest over the same wall time, per request. None when not measured."""
    measured = [c for c in cells if c is not None]
    if not measured:
        return None
    wall_s = sum(c.wall_s for c in measured)
    roles = sorted({role for c in measured for role in c.roles})

    def per_request(cpu_s: float) -> float:
        return cpu_s * 1000 / requests if requests else math.nan

    summary: dict[str, Any] = {}
    for role in roles:
        cpu_s = sum(c.roles[role].cpu_s for c in measured if role in c.roles)
        summary[role] = {
            "processes": max(c.roles[role].processes for c in measured if role in c.roles),
            "cpu_s": cpu_s, "ms_per_request": per_request(cpu_s), "core_share": cpu_s / wall_s,
        }  # fmt: skip
        # Over the cells where the role's wait was read: a cell without it does not dilute the others.
        waits = [(w, c.wall_s) for c in measured if role in c.roles and (w := c.roles[role].wait_s) is not None]
        if waits:
            summary[role][WAIT] = sum(w for w, _ in waits) / sum(wall for _, wall in waits)
        if rest is not None:
            summary[role]["rest_core_share"] = _rest_share(rest, role)
    outside_s = sum(s["cpu_s"] for role, s in summary.items() if role != ENGINE)
    engine_s = summary.get(ENGINE, {}).get("cpu_s", 0.0)
    pooled = {
        "wall_s": wall_s, "requests": requests, "roles": summary,
        "outside_engine_ms_per_request": per_request(outside_s) if roles else math.nan,
        "outside_engine_core_share": outside_s / wall_s if roles else math.nan,
        "engine_ms_per_request": per_request(engine_s) if ENGINE in summary else math.nan,
    }  # fmt: skip
    if rest is not None:
        # The roles of the cells: a process seen only at rest (it exited since) is nobody's background now.
        rest_share = sum(_rest_share(rest, role) for role in summary if role != ENGINE)
        pooled["rest_outside_engine_core_share"] = rest_share
        pooled["above_rest_ms_per_request"] = per_request(outside_s - rest_share * wall_s) if roles else math.nan
    return pooled


def outside_engine_ms(metrics: Mapping[str, Any]) -> float | None:
    """A pooled result's CPU ms per request outside the engine; None when not measured."""
    cpu = metrics.get("cpu")
    return None if cpu is None else cpu["outside_engine_ms_per_request"]


def above_rest_ms(metrics: Mapping[str, Any]) -> float | None:
    """The same above the target's rest; None when not measured (or, in older results, no rest read)."""
    cpu = metrics.get("cpu")
    return None if cpu is None else cpu.get("above_rest_ms_per_request")


def _row(*cells: object) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def markdown(level_name: str, rows: Sequence[tuple[str, str, Mapping[str, Any]]]) -> list[str]:
    """Per target and level, each role's CPU ms per successful request, share of a core, share at rest
    where it was read, and its busiest threads' wait for a CPU as a share of the wall time (a column only
    where some role has it: result files from before it have none, those of stop 29 the main threads'
    instead); the roles outside the engine summed (their CPU, not their waits: those are of threads of
    different kinds); a warning where a target's processes include several Serve clusters."""
    measured = [(level, name, m["cpu"]) for level, name, m in rows if m.get("cpu") is not None]
    if not measured:
        return []
    keys = {key for _, _, cpu in measured for s in cpu["roles"].values() for key in (WAIT, _MAIN_WAIT) if key in s}
    wait_key = WAIT if WAIT in keys else _MAIN_WAIT if keys else None
    threads = "busiest threads" if wait_key == WAIT else "main threads"
    lines = [
        "",
        "CPU time by process role, per successful request and as a share of one core, under load and at rest "
        "(user + system, read before and after each cell, and over `--rest` seconds after the last; "
        "load/bench/cpu.py)"
        + (
            f"; {threads} waiting: the time the role's {threads} were runnable but waiting for a CPU, as a "
            "share of the wall time, added up over its processes"
            + (" (a process's busiest thread of the cell)" if wait_key == WAIT else
               " (a Ray worker's main thread is Ray's task loop, not its requests')")
            if wait_key else ""
        ),
        "",
        _row("target", level_name, "role", "processes", "CPU ms/req", "share of a core", "at rest",
             *([f"{threads} waiting"] if wait_key else [])),
        "|---|---:|---|---:|---:|---:|---:|" + ("---:|" if wait_key else ""),
    ]  # fmt: skip

    def role_row(name: str, level: str, role: str, s: Mapping[str, Any]) -> str:
        cells = [name, level, role, s["processes"], fmt_num(s["ms_per_request"], 2), fmt_num(s["core_share"], 3)]
        return _row(*cells, fmt_num(s.get("rest_core_share"), 3), *([fmt_num(s.get(wait_key), 3)] if wait_key else []))

    mixed = []
    for level, name, cpu in measured:
        roles = cpu["roles"]
        if not roles:
            lines.append(_row(name, level, "no process found", *["-"] * (5 if wait_key else 4)))
            continue
        outside = [(role, s) for role, s in roles.items() if role != ENGINE]
        for role, s in sorted(outside, key=lambda item: -item[1]["cpu_s"]):
            lines.append(role_row(name, level, role, s))
        total = ["-"] if wait_key else []  # threads of different kinds: their waits do not add up to one thing
        lines.append(_row(
            name, level, f"**{OUTSIDE}**", sum(s["processes"] for _, s in outside),
            *(f"**{cell}**" for cell in (
                fmt_num(cpu["outside_engine_ms_per_request"], 2), fmt_num(cpu["outside_engine_core_share"], 3),
                fmt_num(cpu.get("rest_outside_engine_core_share"), 3), *total,
            )),
        ))  # fmt: skip
        if ENGINE in roles:
            lines.append(role_row(name, level, ENGINE, roles[ENGINE]))
        if roles.get(rss.CONTROLLER, {}).get("processes", 0) > 1:
            mixed.append(f"{name} @ {level}")
    if mixed:
        lines += ["", f"**CPU counts more than one Serve cluster** at {', '.join(mixed)}: every Ray process of the "
                  "machine counts for a graph given by URL; stop the other cluster or use --start."]  # fmt: skip
    return lines
