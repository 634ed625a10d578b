"""Overload: a target's capacity, then Poisson (open-loop) load at multiples of it, in one run.

  python -m load.overload --target http://127.0.0.1:8000 --multipliers 1 2 3 --duration 60 --ttft-slo-ms 1000
  python -m load.overload --start graph:configs/cpu-tiny.yaml@tiny-chat --capacity 12 --duration 20

Capacity, unless given with --capacity, is the successful req/s of a closed loop of
--capacity-concurrency users (who wait out a refusal's Retry-After) for --capacity-duration seconds.
Then, per multiplier m, arrivals at m x capacity for --duration seconds, open loop: arrivals do not
wait for answers, so the server sees the load the clients would offer. Per level: requests sent,
succeeded, cleanly rejected (503/429 with an OpenAI error, see outcomes.py) and errors by kind, which
must all be 0; an accounting check, requests started == succeeded + rejected + errors; goodput
(successes whose TTFT meets --ttft-slo-ms, per second); TTFT of the admitted; rejection latency;
`/health` latency; peak RSS of every stage's processes (load/rss.py) against the first level's.
Request throughput and goodput are per second of the level's wall time: arrivals plus the drain of
what was admitted. A hang ends at --request-timeout (seconds without a byte) and counts as an error;
the client's own event-loop lag is reported, so a client that fell behind its arrivals shows.

Writes results.json and results.md under --out (default results/overload/<time>).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from load import outcomes, rss
from load.bench import health, images, report, targets, tts
from load.bench.cli import Bar, build_dataset
from load.bench.datasets import CAPABILITY, IMAGE_TEXT_LEN, TEXT_INPUT_LEN, fetch_model
from load.bench.metrics import meets_slos, summarize_ms, ttfts
from load.bench.runner import Cell, CellResult, Runner, Target, Workload
from load.stats import fmt_num, summary_ms

NAME = "target"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", metavar="URL", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument(
        "--start", metavar="KIND[:CONFIG@APP]", help=f"start one: {', '.join(sorted(targets.LAUNCHERS))}"
    )
    p.add_argument("--dataset", choices=["random", "image", "tts"], default="random", help="as load.bench's")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="chat", help="text and image requests")
    p.add_argument("--input-len", type=int, help=f"prompt tokens (default {TEXT_INPUT_LEN}; image: {IMAGE_TEXT_LEN})")
    p.add_argument("--output-len", type=int, default=32)
    images.add_options(p)
    tts.add_options(p)
    p.add_argument("--capacity", type=float, help="req/s the multipliers apply to (default: measured first)")
    p.add_argument("--capacity-concurrency", type=int, default=32, help="closed-loop users measuring capacity")
    p.add_argument("--capacity-duration", type=float, default=30.0, help="seconds of the capacity measurement")
    p.add_argument("--capacity-only", action="store_true", help="measure capacity, print it and stop")
    p.add_argument("--multipliers", type=float, nargs="+", default=[1.0, 2.0, 3.0], help="load levels x capacity")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per level")
    p.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="goodput: successes with TTFT (TTFA) within")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds without a byte that count as a hang")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each phase")
    p.add_argument("--health-interval", type=float, default=0.1, help="seconds between /health probes")
    p.add_argument("--rss-interval", type=float, default=1.0, help="seconds between RSS samples")
    p.add_argument("--rss-root-pid", type=int, help="count only processes below this one (default: with --start, "
                   "the processes this run started; else every Serve process of the machine)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--label", default="", help="what is special about this run, for the report")
    p.add_argument("--no-progress", action="store_true")
    opts = p.parse_args(argv)
    opts.endpoint = "speech" if opts.dataset == "tts" else opts.endpoint
    if opts.input_len is None:
        opts.input_len = IMAGE_TEXT_LEN if opts.dataset == "image" else TEXT_INPUT_LEN
    if opts.dataset == "image" and opts.endpoint == "completions":
        p.error("--dataset image needs --endpoint chat")
    positive = [opts.duration, opts.capacity_duration, opts.capacity_concurrency, opts.input_len, opts.output_len,
                opts.request_timeout, opts.rss_interval, *opts.multipliers]  # fmt: skip
    if any(value <= 0 for value in positive) or (opts.capacity is not None and opts.capacity <= 0):
        p.error("durations, lengths, the timeout, intervals, --capacity and --multipliers must be positive")
    if opts.capacity_only and opts.capacity is not None:
        p.error("--capacity-only measures the capacity: do not give --capacity")
    return opts


class Progress(Bar):
    """The bench's bar, plus how many requests each cell started, read from the runner's prompt
    counter: a count kept apart from the records, for the accounting check."""

    def __init__(self, total: int, disable: bool) -> None:
        super().__init__(total, disable)
        self.runner: Runner | None = None
        self.started_at = 0
        self.sent: list[int] = []

    def start_cell(self, cell: Cell) -> None:
        super().start_cell(cell)
        assert self.runner is not None
        self.started_at = self.runner.next_prompt[cell.target]

    def end_cell(self, result: CellResult) -> None:
        super().end_cell(result)
        assert self.runner is not None
        self.sent.append(self.runner.next_prompt[result.cell.target] - self.started_at)


def level_summary(result: CellResult, sent: int, ttft_slo_ms: float, arrivals_s: float) -> dict[str, Any]:
    """One level's counts and latencies (ms); rates per second of the level's wall time."""
    records = result.records
    acc = outcomes.account(records, sent)
    good = [r for r in records if r.ok]
    rejected = [r for r in records if outcomes.outcome(r) == outcomes.REJECTED]
    wall_s = result.duration_s
    return {
        "sent": acc.sent,
        "offered_rate": acc.sent / arrivals_s,
        "succeeded": acc.succeeded,
        "rejected": acc.rejected,
        "errors": acc.errors,
        "error_details": acc.error_details,
        "balanced": acc.balanced,
        "clean": acc.clean,
        "wall_s": wall_s,
        "throughput": len(good) / wall_s,
        "goodput": sum(meets_slos(r, {"ttft": ttft_slo_ms}) for r in good) / wall_s,
        "ttft_ms": summarize_ms(ttfts(good)),
        "e2el_ms": summarize_ms([r.latency for r in good if r.latency is not None]),
        "rejection_latency_ms": summarize_ms([r.latency for r in rejected if r.latency is not None]),
        "health_ms": health.summarize(result.health),
        "client_loop_lag_ms": summary_ms(result.loop_lag),
    }


def capacity_of(result: CellResult) -> float:
    return sum(r.ok for r in result.records) / result.duration_s


async def _measure(runner: Runner, opts: argparse.Namespace) -> tuple[float, list[CellResult]]:
    """The capacity phase (unless given), then the levels. One runner for both, so that no prompt is
    sent twice (a repeat would hit the engine's prefix cache)."""
    cells = []
    capacity = opts.capacity
    if capacity is None:
        runner.workload = _workload(opts, "concurrency", (float(opts.capacity_concurrency),))
        cells = await runner.run()
        capacity = capacity_of(cells[0])
        if capacity == 0:
            raise SystemExit(f"no request succeeded while measuring capacity: {outcomes.account(cells[0].records)}")
    if not opts.capacity_only:
        runner.workload = _workload(opts, "rate", tuple(m * capacity for m in opts.multipliers))
        cells += await runner.run()
    return capacity, cells


def _workload(opts: argparse.Namespace, mode: Any, levels: tuple[float, ...]) -> Workload:
    capacity_phase = mode == "concurrency"
    return Workload(
        mode=mode, levels=levels, duration_s=opts.capacity_duration if capacity_phase else opts.duration,
        endpoint=opts.endpoint, warmup=opts.warmup, health_interval_s=opts.health_interval,
        request_timeout_s=opts.request_timeout, seed=opts.seed, honor_retry_after=capacity_phase,
    )  # fmt: skip


def build(
    opts: argparse.Namespace, capacity: float, cells: Sequence[CellResult], sent: Sequence[int],
    samples: Sequence[rss.RssSample],
) -> dict[str, Any]:  # fmt: skip
    """The results document; `cells` and `sent` are the capacity phase's (when measured), then the levels'."""
    measured = opts.capacity is None
    document: dict[str, Any] = {"kind": "overload", "ttft_slo_ms": opts.ttft_slo_ms, "capacity": capacity}
    if measured:
        phase = cells[0]
        document["capacity_phase"] = {
            "concurrency": opts.capacity_concurrency,
            **level_summary(phase, sent[0], opts.ttft_slo_ms, opts.capacity_duration),
        }  # fmt: skip
    levels = []
    multipliers = [] if opts.capacity_only else opts.multipliers
    for multiplier, cell, n in zip(multipliers, cells[measured:], sent[measured:], strict=True):
        end = cell.started_at + cell.duration_s
        levels.append({
            "multiplier": multiplier, "rate": cell.cell.level,
            **level_summary(cell, n, opts.ttft_slo_ms, opts.duration),
            "rss": rss.summarize(samples, cell.started_at, end),
        })  # fmt: skip
    document["levels"] = levels
    document["clean"] = all(level["clean"] for level in levels)
    return dict(report.jsonable(document))  # empty summaries' NaN becomes null, as in the JSON file


def _vs(value: float, reference: float | None) -> str:
    return f"{value:,.0f}" if not reference else f"{value:,.0f} ({value / reference:.2f}x)"


def markdown(result: dict[str, Any]) -> str:
    levels = result["levels"]
    how = "measured" if "capacity_phase" in result else "given"
    lines = [f"Capacity ({how}): {result['capacity']:.2f} req/s."]
    if "capacity_phase" in result:
        phase = result["capacity_phase"]
        lines[0] += (
            f" Closed loop of {phase['concurrency']} users for {phase['wall_s']:.0f} s: {phase['succeeded']} ok, "
            f"{phase['rejected']} rejected, {sum(phase['errors'].values())} errors, TTFT p50 / p99 "
            f"{fmt_num(phase['ttft_ms']['p50'])} / {fmt_num(phase['ttft_ms']['p99'])} ms."
        )
    if not levels:
        return lines[0] + "\n"
    lines += [
        "",
        f"Goodput: successes with TTFT ≤ {result['ttft_slo_ms']:g} ms per second of the level's wall time "
        "(arrivals and drain). Rejected: 503/429 with an OpenAI error. Latencies in ms.",
        "",
        "| load | offered req/s | sent | ok | rejected | errors | balanced | req/s | goodput req/s | TTFT p50 "
        "| TTFT p99 | rejection p50 | rejection p99 | /health p99 | client lag max |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level in levels:
        ttft_ms, rejection = level["ttft_ms"], level["rejection_latency_ms"]
        lines.append(
            f"| {level['multiplier']:g}x | {level['offered_rate']:.2f} | {level['sent']} | {level['succeeded']} "
            f"| {level['rejected']} | {sum(level['errors'].values())} | {'yes' if level['balanced'] else '**no**'} "
            f"| {level['throughput']:.2f} | {level['goodput']:.2f} | {fmt_num(ttft_ms['p50'])} "
            f"| {fmt_num(ttft_ms['p99'])} "
            f"| {fmt_num(rejection['p50'])} | {fmt_num(rejection['p99'])} | {fmt_num(level['health_ms']['p99'])} "
            f"| {fmt_num(level['client_loop_lag_ms']['max'])} |"
        )
    stages = sorted({stage for level in levels for stage in level["rss"]})
    first = levels[0]["rss"] if levels else {}
    if stages:
        lines += ["", f"Peak RSS per stage, MiB (vs {levels[0]['multiplier']:g}x)", "",
                  "| stage | " + " | ".join(f"{level['multiplier']:g}x" for level in levels) + " |",
                  "|---|" + "---:|" * len(levels)]  # fmt: skip
        for stage in stages:
            reference = first.get(stage, {}).get("peak_mib")
            peaks = [_vs(level["rss"][stage]["peak_mib"], reference) if stage in level["rss"] else "-"
                     for level in levels]  # fmt: skip
            lines.append(f"| {stage} | " + " | ".join(peaks) + " |")
        lines += rss.mixed_clusters_warning(levels[-1]["rss"])
    errors = [f"{level['multiplier']:g}x: {level['errors']} ({'; '.join(level['error_details'])})"
              for level in levels if level["errors"]]  # fmt: skip
    verdict = "yes" if result["clean"] else "**no**"
    lines += ["", f"Every request got exactly one success or clean rejection: {verdict}"]
    lines += [f"- errors at {line}" for line in errors]
    lag = max((level["client_loop_lag_ms"]["max"] or 0.0 for level in levels), default=0.0)
    if lag > report.STALLED_MS:
        lines.append(f"- **the client stalled** (event-loop lag up to {lag:.0f} ms): its arrivals came late")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    opts = parse_args(argv)
    out: Path = opts.out or Path("results/overload") / time.strftime("%Y%m%d-%H%M%S")
    phases = (opts.capacity is None) + (0 if opts.capacity_only else len(opts.multipliers))
    with targets.started([opts.start] if opts.start else [], out) as started:
        url = started[opts.start.partition(":")[0]] if opts.start else opts.target.rstrip("/")
        with httpx.Client(timeout=60) as client:
            model = fetch_model(client, url, CAPABILITY.get(opts.dataset))
        dataset, _ = build_dataset(opts, {NAME: url}, {NAME: model})
        # The graph this run started descends from this process: count its processes only.
        root_pid = os.getpid() if opts.start and opts.rss_root_pid is None else opts.rss_root_pid
        progress = Progress(phases, opts.no_progress)
        runner = Runner([Target(NAME, url, model.name)], dataset, _workload(opts, "rate", (1.0,)), progress)
        progress.runner = runner
        try:
            with rss.RssSampler(opts.rss_interval, root_pid) as sampler:
                capacity, cells = asyncio.run(_measure(runner, opts))
        finally:
            progress.close()
    print(f"capacity: {capacity:.2f} req/s")
    results = build(opts, capacity, cells, progress.sent, sampler.samples)
    return report.save(results, opts, "load.overload", argv, out, markdown, target={"url": url, "model": model.name})


if __name__ == "__main__":
    main()
