"""Resident memory (RSS) of each stage of a running Serve graph, sampled over time beside a load run.

Ray names a worker process after the actor it hosts: `ray::ServeReplica:<app>:<deployment>` for a
replica (a method name may follow while it runs one), `ray::ProxyActor` and `ray::ServeController`
for Serve's own actors. A stage's RSS is that of its processes and all their descendants: the llm
replica forks vLLM's EngineCore, and counting the engine apart from its stage would hide where the
memory goes. Replicas of one deployment are added up. Several Serve clusters on one machine (other
test runs) would be added up too: give `root_pid` (an ancestor of the one cluster, e.g. the process
that started it) to count only its processes.

`python -m load.rss --duration 30` prints start / peak / end per stage of the graphs running now.
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

MIB = 2**20
PROXY = "proxy"
CONTROLLER = "controller"
_REPLICA = re.compile(r"ray::ServeReplica:(?P<app>[^:\s]+):(?P<deployment>[^\s.]+)")
_SERVE_ACTORS = {"ray::ProxyActor": PROXY, "ray::ServeController": CONTROLLER}
# Parent links deeper than this are a cycle (a pid reused while the table was read), not a real tree.
_MAX_DEPTH = 64


@dataclass(frozen=True)
class ThreadTimes:
    cpu_s: float
    wait_s: float  # runnable but waiting on a run queue


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    title: str  # the command line as `ps -o args` shows it: Ray's process title for its workers
    rss_bytes: int
    # For CPU accounting (load/bench/cpu.py): user + system seconds so far, the process group, and the
    # start time, which tells a pid reused between two readings apart from the process read before.
    cpu_s: float = 0.0
    pgid: int = 0
    started: float = 0.0
    # Each thread's time on a CPU and waiting for one so far, by thread id (`list_processes(threads=True)`);
    # None where not read or not readable (gone since it was listed, or a kernel without schedstats).
    threads: Mapping[int, ThreadTimes] | None = None


def lineage(table: Mapping[int, Proc], pid: int) -> list[int]:
    """`pid`, its parent, grandparent, ... up to the first pid missing from `table` (included: a parent
    that could not be read is still known by its pid)."""
    chain: list[int] = []
    current: int | None = pid
    for _ in range(_MAX_DEPTH):
        if current is None:
            break
        chain.append(current)
        if current not in table:
            break
        parent = table[current].ppid
        current = parent if parent != current else None
    return chain


def stage_of(title: str) -> str | None:
    """`app:deployment` for a replica, `proxy` or `controller` for Serve's actors, None for the rest."""
    if match := _REPLICA.match(title):
        return f"{match['app']}:{match['deployment']}"
    head = title.split(" ", 1)[0].split(".", 1)[0]
    return _SERVE_ACTORS.get(head)


@dataclass(frozen=True)
class StageRss:
    rss_bytes: int
    processes: int  # the stage's own processes (replicas), not their children


def stage_rss(procs: Iterable[Proc], root_pid: int | None = None) -> dict[str, StageRss]:
    """RSS per stage: each process counts for its nearest stage process among itself and its ancestors.
    With `root_pid`, only processes descending from it count."""
    table = {p.pid: p for p in procs}
    stages = {pid: stage for pid, p in table.items() if (stage := stage_of(p.title)) is not None}
    rss: dict[str, int] = {}
    count: dict[str, int] = {}
    for p in table.values():
        chain = lineage(table, p.pid)
        owner = next((stages[pid] for pid in chain if pid in stages), None)
        # The root itself may be missing from the table (e.g. not readable): `lineage` still names it.
        inside = root_pid is None or root_pid in chain
        if owner is None or not inside:
            continue
        rss[owner] = rss.get(owner, 0) + p.rss_bytes
        count[owner] = count.get(owner, 0) + (p.pid in stages)
    return {stage: StageRss(rss[stage], count[stage]) for stage in sorted(rss)}


def list_processes(threads: bool = False) -> list[Proc]:
    """Every readable process of the machine (those that vanish or are not ours to read are skipped); with
    `threads`, each one's threads' times too (a file per thread: for the CPU meter's readings around a
    cell, not for a sampler reading every second)."""
    procs = []
    fields = ["pid", "ppid", "cmdline", "memory_info", "cpu_times", "create_time"]
    for p in psutil.process_iter(fields, ad_value=None):
        info = p.info
        if info["cmdline"] and info["memory_info"] is not None:
            cpu = info["cpu_times"]
            procs.append(Proc(
                info["pid"], info["ppid"] or 0, " ".join(info["cmdline"]), info["memory_info"].rss,
                cpu_s=cpu.user + cpu.system if cpu is not None else 0.0, pgid=_pgid(info["pid"]),
                started=info["create_time"] or 0.0, threads=thread_times(info["pid"]) if threads else None,
            ))  # fmt: skip
    return procs


def thread_times(pid: int, proc_root: Path = Path("/proc")) -> dict[int, ThreadTimes] | None:
    """Each thread of `pid`: its time on a CPU and on a run queue so far (the first two fields of its
    schedstat, in ns). None when none can be read: the process is gone, or the kernel keeps no schedstats."""
    try:
        tasks = list((proc_root / str(pid) / "task").iterdir())
    except OSError:
        return None
    times = {}
    for task in tasks:
        try:
            ran, waited = task.joinpath("schedstat").read_text().split()[:2]
            times[int(task.name)] = ThreadTimes(int(ran) / 1e9, int(waited) / 1e9)
        except (OSError, ValueError):  # a thread that ended since the listing, or no schedstats
            continue
    return times or None


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:  # gone since it was listed: 0 is no process group
        return 0


@dataclass(frozen=True)
class RssSample:
    at: float  # perf_counter, the clock of the bench's request records
    stages: dict[str, StageRss]


class RssSampler:
    """Samples `stage_rss` every `interval_s` in a background thread, from `start()` to `stop()` (or as a
    context manager). A thread, not a task: reading /proc blocks, and the load client's event loop
    must not wait for it."""

    def __init__(
        self, interval_s: float = 1.0, root_pid: int | None = None,
        list_procs: Callable[[], list[Proc]] = list_processes,
    ) -> None:  # fmt: skip
        self.interval_s = interval_s
        self.root_pid = root_pid
        self.list_procs = list_procs
        self.samples: list[RssSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> RssSample:
        sample = RssSample(time.perf_counter(), stage_rss(self.list_procs(), self.root_pid))
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> list[RssSample]:
        """Stops sampling after one last sample; returns all samples."""
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.samples

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def summarize(samples: Sequence[RssSample], start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """Per stage, in MiB: RSS at the first and last sample taken in [start, end], and the peak; also the
    most processes the stage had. A stage missing from some samples (a replica restarting) is summed
    over those it is in."""
    inside = [s for s in samples if (start is None or s.at >= start) and (end is None or s.at <= end)]
    stages = sorted({stage for s in inside for stage in s.stages})
    summary: dict[str, Any] = {}
    for stage in stages:
        seen = [s.stages[stage] for s in inside if stage in s.stages]
        summary[stage] = {
            "start_mib": seen[0].rss_bytes / MIB,
            "peak_mib": max(r.rss_bytes for r in seen) / MIB,
            "end_mib": seen[-1].rss_bytes / MIB,
            "processes": max(r.processes for r in seen),
            "samples": len(seen),
        }
    return summary


def mixed_clusters_warning(summary: dict[str, Any]) -> list[str]:
    """A warning line when the samples saw more than one Serve controller: RSS of other clusters (another
    test run's) is then added in, and `root_pid` should name the measured one's ancestor."""
    controllers = summary.get(CONTROLLER, {}).get("processes", 0)
    if controllers <= 1:
        return []
    return [f"**RSS counts {controllers} Serve clusters** (other graphs on this machine): give --rss-root-pid."]


def markdown(summary: dict[str, Any]) -> list[str]:
    """A table of `summarize`'s result: start / peak / end MiB per stage."""
    lines = ["| stage | processes | start MiB | peak MiB | end MiB | end - start |", "|---|---:|---:|---:|---:|---:|"]
    for stage, s in summary.items():
        lines.append(
            f"| {stage} | {s['processes']} | {s['start_mib']:,.0f} | {s['peak_mib']:,.0f} | {s['end_mib']:,.0f} "
            f"| {s['end_mib'] - s['start_mib']:+,.0f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m load.rss", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--duration", type=float, default=10.0, help="seconds to sample")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--root-pid", type=int, default=None, help="count only descendants of this process")
    opts = parser.parse_args(argv)
    with RssSampler(opts.interval, opts.root_pid) as sampler:
        time.sleep(opts.duration)
    print("\n".join(markdown(summarize(sampler.samples))))


if __name__ == "__main__":
    main()
