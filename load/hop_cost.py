"""What one Ray Serve hop costs: the CPU of a streaming call between two replicas, and of each item it streams.

A text request crosses one such hop in the graph: the ingress's streaming call to its llm replica, which
streams a chunk every `engine.stream_interval` tokens (~9 for 32 tokens at 4). This puts two no-op
deployments into a running cluster as an application of their own (`hop-cost`, no HTTP route, no CPU
reserved), so they run under that cluster's Serve settings (configs/ray.env for `make serve`'s), and
times `--calls` back-to-back calls per row from one replica to the other, then removes the application.
With `--gap-ms`, the callee waits that long before each item, as an engine does between its outputs: an
item that finds both replicas' loops idle pays their wake-ups, which back-to-back items share.
Each replica reads its process's CPU time (every thread) around the calls, and again over the same wall
time with nothing sent; the difference, per call, is the hop's. Rows: Serve's gRPC transport between
replicas (what throughput mode uses) and Ray's actor calls (`_by_reference`), each streaming one item
and `--items` items; an item costs (CPU at `--items` - CPU at one) / (`--items` - 1).

  RAY_ADDRESS=127.0.0.1:6379 RAY_AUTH_MODE=token python -m load.hop_cost --calls 300 --out results/hop.json
  ... python -m load.hop_cost --calls 200 --gap-ms 15 --out results/hop-gap15.json

It competes with whatever else the cluster runs: measure a cluster at rest.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

from ray import serve
from ray.serve import Deployment
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from load.meta import run_meta, save_result
from load.stats import summary_ms

APP = "hop-cost"
TRANSPORTS = {"grpc": False, "actor": True}  # name -> the handle's `_by_reference`


@serve.deployment(max_ongoing_requests=8, ray_actor_options={"num_cpus": 0})
class Callee:
    async def stream(self, items: int, gap_s: float) -> AsyncIterator[int]:
        for i in range(items):
            if gap_s:
                await asyncio.sleep(gap_s)
            yield i

    def cpu_s(self) -> float:
        return time.process_time()


@serve.deployment(max_ongoing_requests=1, ray_actor_options={"num_cpus": 0})
class Caller:
    def __init__(self, callee: DeploymentHandle[Any]) -> None:
        # As the ingress calls its stages (deployments/ingress.py): the standard pickle both ways.
        self._callee = callee.options(request_serialization="pickle", response_serialization="pickle")

    async def run(self, calls: int, items: int, by_reference: bool, gap_s: float) -> dict[str, Any]:
        """`calls` sequential streaming calls of `items` items each, then as long at rest; CPU seconds of both."""
        stream = self._callee.options(stream=True, _by_reference=by_reference)
        first_s: list[float] = []
        busy = await self._cpu()
        start = time.perf_counter()
        for _ in range(calls):
            sent = time.perf_counter()
            response = stream.stream.remote(items, gap_s)
            assert isinstance(response, DeploymentResponseGenerator)
            async for i in response:
                if i == 0:
                    first_s.append(time.perf_counter() - sent)
        wall_s = time.perf_counter() - start
        rest = await self._cpu()
        await asyncio.sleep(wall_s)
        end = await self._cpu()
        return {
            "wall_s": wall_s,
            "busy_cpu_s": [b - a for a, b in zip(busy, rest, strict=True)],
            "rest_cpu_s": [b - a for a, b in zip(rest, end, strict=True)],
            "first_item_ms": summary_ms(first_s),
        }

    async def _cpu(self) -> tuple[float, float]:
        """This process's and the callee's CPU time."""
        return time.process_time(), await self._callee.cpu_s.remote()


def per_call_ms(run: dict[str, Any], calls: int) -> dict[str, float]:
    """Each side's CPU per call above its CPU at rest over the same wall time."""
    sides = zip(("caller", "callee"), run["busy_cpu_s"], run["rest_cpu_s"], strict=True)
    return {side: (busy - rest) / calls * 1000 for side, busy, rest in sides}


def median_per_call_ms(runs: list[dict[str, Any]], calls: int) -> dict[str, float]:
    """Each side's median over rounds of its CPU per call."""
    per_run = [per_call_ms(run, calls) for run in runs]
    return {side: statistics.median(r[side] for r in per_run) for side in per_run[0]}


def rows(runs: dict[tuple[str, int], list[dict[str, Any]]], calls: int, items: int) -> list[dict[str, Any]]:
    """A row per transport: CPU per call streaming one item, per further item (medians over the rounds),
    and the first item's latency (p50 of the first round)."""
    out = []
    for transport in TRANSPORTS:
        one, many = median_per_call_ms(runs[transport, 1], calls), median_per_call_ms(runs[transport, items], calls)
        out.append({
            "transport": transport,
            "caller_ms_per_call": one["caller"],
            "callee_ms_per_call": one["callee"],
            "ms_per_call": one["caller"] + one["callee"],
            "ms_per_item": sum(many[s] - one[s] for s in one) / (items - 1),
            "first_item_p50_ms": runs[transport, 1][0]["first_item_ms"]["p50"],
        })  # fmt: skip
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| transport | CPU per call, caller ms | callee ms | both ms | CPU per further item, ms | first item p50, ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        keys = ("caller_ms_per_call", "callee_ms_per_call", "ms_per_call", "ms_per_item", "first_item_p50_ms")
        values = [r[key] for key in keys]
        lines.append(f"| {r['transport']} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines)


def measure(calls: int, items: int, rounds: int, gap_s: float) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Deploys the pair, runs every (transport, items) cell `rounds` times, interleaved, and removes it."""
    # Typed as classes by mypy; `serve.deployment` made them Deployments.
    serve.run(cast(Deployment, Caller).bind(cast(Deployment, Callee).bind()), name=APP, route_prefix=None)
    try:
        return asyncio.run(_cells(calls, items, rounds, gap_s))
    finally:
        serve.delete(APP)


async def _cells(calls: int, items: int, rounds: int, gap_s: float) -> dict[tuple[str, int], list[dict[str, Any]]]:
    # Called from a running event loop: in Serve's throughput mode (configs/ray.env exported) a handle's
    # router runs on the caller's loop, and a handle used from plain synchronous code fails.
    handle = serve.get_app_handle(APP)
    await handle.run.remote(10, items, False, gap_s)  # warm: connections, imports, first-call caches
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for transport, by_reference in TRANSPORTS.items():
            for n in (1, items):
                runs.setdefault((transport, n), []).append(await handle.run.remote(calls, n, by_reference, gap_s))
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls per cell")
    parser.add_argument("--items", type=int, default=9, help="items streamed per call in the second cell (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every cell; rows give their median")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="the callee's wait before each item (0: none)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.items < 2:
        parser.error("--items must be at least 2")
    if args.gap_ms < 0:
        parser.error("--gap-ms must not be negative")
    runs = measure(args.calls, args.items, args.rounds, args.gap_ms / 1000)
    result = {
        "kind": "hop_cost",
        **run_meta("load.hop_cost", list(argv) if argv is not None else None),
        "calls": args.calls,
        "items": args.items,
        "rounds": args.rounds,
        "gap_ms": args.gap_ms,
        "runs": {f"{transport}/{n}": run for (transport, n), run in runs.items()},
        "rows": rows(runs, args.calls, args.items),
    }
    print(markdown(result))
    save_result(args.out, result)


if __name__ == "__main__":
    main()
