"""CPU of servers at rest, by process role: what a deployment costs before it serves anything.

A bench divides a cell's CPU by its requests, so a server's background (Ray's and Serve's own loops,
health checks, idle replicas of other models) shows up as CPU per request that grows as the engine gets
slower. The bench reads it too (`--rest`) and subtracts it; this reads it on its own: every target's
processes (found by URL as `load.bench` finds them, load/bench/cpu.py), read `--seconds` apart with no
load sent, as shares of a core per role.

  python -m load.idle_cpu --target graph=http://127.0.0.1:8000 --target vllm=http://127.0.0.1:8200 --seconds 30
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from load import rss
from load.bench import cpu
from load.meta import run_meta, save_result


def shares(cell: cpu.CellCpu) -> dict[str, Any]:
    """Per role, its processes and share of a core; the total, and the total outside the engine."""
    roles = {
        role: {"processes": r.processes, "core_share": r.cpu_s / cell.wall_s}
        for role, r in sorted(cell.roles.items(), key=lambda item: -item[1].cpu_s)
    }
    outside = sum(r["core_share"] for role, r in roles.items() if role != cpu.ENGINE)
    engine = roles.get(cpu.ENGINE, {}).get("core_share", 0.0)
    return {
        "wall_s": cell.wall_s,
        "roles": roles,
        "outside_engine_core_share": outside,
        "total_core_share": outside + engine,
    }


def markdown(targets: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["| target | role | processes | share of a core |", "|---|---|---:|---:|"]
    for name, t in targets.items():
        for role, r in t["roles"].items():
            lines.append(f"| {name} | {role} | {r['processes']} | {r['core_share']:.4f} |")
        lines.append(f"| {name} | **outside engine** | | **{t['outside_engine_core_share']:.3f}** |")
        lines.append(f"| {name} | **all** | | **{t['total_core_share']:.3f}** |")
    return "\n".join(lines)


def measure(urls: Mapping[str, str], seconds: float) -> dict[str, dict[str, Any]]:
    meter, missing = cpu.meter({}, urls, list_procs=rss.list_processes)  # CPU only: no thread times
    if missing:
        raise SystemExit(f"no process of this machine listens for {', '.join(missing)}")
    return {name: shares(cell) for name, cell in cpu.at_rest(meter, list(urls), seconds).items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", required=True, metavar="NAME=URL", help="a running server")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    opts = parser.parse_args(argv)
    if any("=" not in t for t in opts.target):
        parser.error("--target takes NAME=URL")
    urls = dict(t.split("=", 1) for t in opts.target)
    result = {
        **run_meta("load.idle_cpu", list(argv) if argv is not None else None),
        "label": opts.label,
        "kind": "idle_cpu",
        "seconds": opts.seconds,
        "targets": measure(urls, opts.seconds),
    }
    print(markdown(result["targets"]))
    save_result(opts.out, result)


if __name__ == "__main__":
    main()
