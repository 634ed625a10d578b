"""Results of a run: one JSON document and its markdown tables."""

from __future__ import annotations

import datetime
import itertools
import json
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from load.bench import cpu, health, metrics, text_probe
from load.bench.client import RequestRecord
from load.bench.runner import CellResult, Workload
from load.bench.sse import STAGE_HEADERS
from load.meta import run_meta
from load.stats import fmt_num, summary_ms

# Client loop lag above which the markdown warns: a 10 ms sleeper woken this late means the client
# itself was not running for as long as a slow server would make it wait.
STALLED_MS = 50.0
# Until this commit (061fa78) `--start` launched its servers in a session of their own: a scheduling
# autogroup apart from the client's, where a server measured about half its throughput
# (docs/benchmarks-notes.md, "Server and client in one scheduling group").
SESSION_FIX = datetime.datetime(2026, 11, 22, 4, 37, 2, tzinfo=datetime.UTC)
SESSION_HANDICAP = "started by --start in a session of its own (before 2026-11-22), up to ~2x slower"

Compute = Callable[[Sequence[RequestRecord], float], dict[str, Any]]


def level_key(level: float) -> str:
    return f"{level:g}"


def build(
    cells: Sequence[CellResult], workload: Workload, targets: dict[str, dict[str, Any]], config: dict[str, Any],
    slos_ms: dict[str, float], underrun_threshold_ms: float = metrics.UNDERRUN_THRESHOLD_MS,
    rest: Mapping[str, cpu.CellCpu] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Per target and level, the metrics of all rounds pooled (durations added up), CPU also above the
    target's `rest` (`cpu.at_rest`); per cell, a short line to judge the spread between rounds; the
    /health samples on the run's time axis."""

    def compute(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
        if workload.endpoint == "speech":
            return metrics.compute_speech(records, duration_s, underrun_threshold_ms)
        return metrics.compute(records, duration_s, slos_ms)

    t0 = min((c.started_at for c in cells), default=0.0)
    results: dict[str, dict[str, Any]] = {name: {} for name in targets}
    for name in targets:
        for level in workload.levels:
            mine = [c for c in cells if c.cell.target == name and c.cell.level == level]
            pooled = compute([r for c in mine for r in c.records], sum(c.duration_s for c in mine))
            pooled["health_ms"] = health.summarize([s for c in mine for s in c.health])
            pooled["health_stamped_ms"] = health.summarize_stamped([s for c in mine for s in c.health])
            pooled["client_loop_lag_ms"] = summary_ms([lag for c in mine for lag in c.loop_lag])
            pooled["cpu"] = cpu.pool([c.cpu for c in mine], pooled["completed"], (rest or {}).get(name))
            if probes := text_probe.summarize([r for c in mine for r in c.text_probes]):
                pooled["text_probe"] = probes
            results[name][level_key(level)] = pooled
    return {
        "config": config,
        "mode": workload.mode,
        "endpoint": workload.endpoint,
        "levels": [level_key(level) for level in workload.levels],
        "slos_ms": slos_ms,
        "targets": targets,
        "results": results,
        "cells": [_cell_line(c, t0, compute) for c in cells],
        "health_series": {
            name: health.per_second([s for c in cells if c.cell.target == name for s in c.health], t0)
            for name in targets
        },
        "health_timeline": {
            name: [
                [round(s.sent_at - t0, 3), round(s.latency * 1000, 3), s.status]
                for c in cells
                if c.cell.target == name
                for s in c.health
            ]
            for name in targets
        },
    }


def _cell_line(c: CellResult, t0: float, compute: Compute) -> dict[str, Any]:
    m = compute(c.records, c.duration_s)
    if "ttfa_ms" in m:
        latencies = {"rejected": m["rejected"], "ttfa_p50_ms": m["ttfa_ms"]["p50"], "rtf_p50": m["rtf"]["p50"],
                     "underrun_rate": m["underrun_rate"]}  # fmt: skip
    else:
        latencies = {"ttft_p50_ms": m["ttft_ms"]["p50"], "tpot_p50_ms": m["tpot_ms"]["p50"]}
    cell_cpu = cpu.pool([c.cpu], m["completed"])
    if probes := text_probe.summarize(c.text_probes):
        latencies["text_probe_ttft_p50_ms"] = probes["ttft_ms"]["p50"]
    return {
        "round": c.cell.round, "level": level_key(c.cell.level), "target": c.cell.target,
        "start_s": round(c.started_at - t0, 3), "duration_s": c.duration_s,
        "completed": m["completed"], "failed": m["failed"], "request_throughput": m["request_throughput"],
        **latencies, "health_p99_ms": health.summarize(c.health)["p99"],
        "cpu_outside_engine_ms_per_request": None if cell_cpu is None else cell_cpu["outside_engine_ms_per_request"],
    }  # fmt: skip


def jsonable(value: Any) -> Any:
    """NaN (an empty summary) becomes null: NaN is not JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _dist(summary: dict[str, float], digits: int = 1) -> str:
    return " / ".join(fmt_num(summary[k], digits) for k in ("mean", "p50", "p90", "p99"))


def _num_pair(summary: dict[str, float] | None) -> str:
    return "-" if summary is None else f"{fmt_num(summary['p50'], 2)} / {fmt_num(summary['p99'], 2)}"


Row = tuple[str, str, dict[str, Any]]  # level, target, its pooled metrics
CPU_COLUMN = "CPU ms/req outside engine"
ABOVE_REST_COLUMN = "above rest"


def _text_tables(results: dict[str, Any], level_name: str, rows: list[Row]) -> list[str]:
    slos = ", ".join(f"{k} ≤ {v:g} ms" for k, v in results["slos_ms"].items()) or "no SLOs given"
    lines = [
        f"Throughput and `/health` under load (goodput: {slos}; /health in ms)",
        "",
        f"| target | {level_name} | ok | failed | req/s | out tok/s | goodput req/s | /health p50 | p95 | p99 | max "
        f"| {CPU_COLUMN} | {ABOVE_REST_COLUMN} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level, name, m in rows:
        h = m["health_ms"]
        lines.append(
            f"| {name} | {level} | {m['completed']} | {m['failed']} | {fmt_num(m['request_throughput'], 2)} "
            f"| {fmt_num(m['output_throughput'])} | {fmt_num(m['request_goodput'], 2)} | {fmt_num(h['p50'], 2)} "
            f"| {fmt_num(h['p95'], 2)} | {fmt_num(h['p99'], 2)} | {fmt_num(h['max'], 2)} "
            f"| {fmt_num(cpu.outside_engine_ms(m), 2)} | {fmt_num(cpu.above_rest_ms(m), 2)} |"
        )
    lines += [
        "",
        "Latency in ms: mean / p50 / p90 / p99",
        "",
        f"| target | {level_name} | TTFT | TPOT | ITL | E2EL |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for level, name, m in rows:
        lines.append(
            f"| {name} | {level} | {_dist(m['ttft_ms'])} | {_dist(m['tpot_ms'])} | {_dist(m['itl_ms'])} "
            f"| {_dist(m['e2el_ms'])} |"
        )
    return lines


def _speech_table(level_name: str, rows: list[Row]) -> list[str]:
    threshold = rows[0][2]["underrun_threshold_ms"] if rows else metrics.UNDERRUN_THRESHOLD_MS
    lines = [
        "Text to speech under load. audio s/s: seconds of audio streamed per second; RTF: E2EL / audio duration; "
        "underrun: how late a stream's most delayed chunk came for a player that started at the first chunk, "
        f"and the share of streams late by more than {threshold:g} ms; rejected: HTTP 503 (at capacity). "
        f"TTFA, underrun and /health in ms; ⚠: fewer than {metrics.MIN_STREAMS} streams",
        "",
        f"| target | {level_name} | ok | failed | rejected | req/s | audio s/s | TTFA p50 | TTFA p99 | RTF p50 "
        f"| RTF p99 | underrun rate | underrun p99 | /health p50 | p99 | max | {CPU_COLUMN} | {ABOVE_REST_COLUMN} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    few = [f"{name} @ {level}: {m['completed']}" for level, name, m in rows if m["completed"] < metrics.MIN_STREAMS]
    for level, name, m in rows:
        h, ttfa, rtf = m["health_ms"], m["ttfa_ms"], m["rtf"]
        ok = f"{m['completed']}" + (" ⚠" if m["completed"] < metrics.MIN_STREAMS else "")
        lines.append(
            f"| {name} | {level} | {ok} | {m['failed']} | {m['rejected']} "
            f"| {fmt_num(m['request_throughput'], 2)} | {fmt_num(m['audio_throughput'], 2)} "
            f"| {fmt_num(ttfa['p50'])} | {fmt_num(ttfa['p99'])} | {fmt_num(rtf['p50'], 3)} | {fmt_num(rtf['p99'], 3)} "
            f"| {fmt_num(m['underrun_rate'], 3)} | {fmt_num(m['underrun_ms']['p99'])} "
            f"| {fmt_num(h['p50'], 2)} | {fmt_num(h['p99'], 2)} | {fmt_num(h['max'], 2)} "
            f"| {fmt_num(cpu.outside_engine_ms(m), 2)} | {fmt_num(cpu.above_rest_ms(m), 2)} |"
        )
    if few:
        lines += ["", f"**Too few streams** (fewer than {metrics.MIN_STREAMS} succeeded; their percentiles are not fit "
                  f"to compare; rerun with a longer --duration or --min-streams): {'; '.join(few)}"]  # fmt: skip
    lines += [
        "",
        "Distributions: mean / p50 / p90 / p99",
        "",
        f"| target | {level_name} | TTFA ms | E2EL ms | RTF | underrun ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for level, name, m in rows:
        lines.append(
            f"| {name} | {level} | {_dist(m['ttfa_ms'])} | {_dist(m['e2el_ms'])} | {_dist(m['rtf'], 3)} "
            f"| {_dist(m['underrun_ms'])} |"
        )
    return lines


def _stamped_health_table(level_name: str, rows: list[Row]) -> list[str]:
    """`/health` by the kernel's stamps (load/bench/health.py); nothing for runs before they were taken."""
    stamped = [(level, name, m["health_stamped_ms"]) for level, name, m in rows if "health_stamped_ms" in m]
    if not stamped:
        return []
    lines = [
        "",
        "`/health` as the kernel stamped it, in ms: from just before each probe was written to the arrival of its "
        "answer's last bytes, without the probe process's own wait to read them (the table above includes it)",
        "",
        f"| target | {level_name} | stamped | unstamped | p50 | p95 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level, name, h in stamped:
        lines.append(
            f"| {name} | {level} | {h['n']} | {h['unstamped']} | "
            + " | ".join(fmt_num(h[k], 2) for k in ("p50", "p95", "p99", "max"))
            + " |"
        )
    return lines


def _text_probe_table(level_name: str, rows: list[Row], config: dict[str, Any]) -> list[str]:
    """The text probes' table (`text_probe.py`; how they were sent: the run's `config`); nothing without probes."""
    probed = [(level, name, m["text_probe"]) for level, name, m in rows if m.get("text_probe")]
    if not probed:
        return []
    interval_s, priority = config.get("text_probe_interval"), config.get("text_probe_priority")
    every = f"every {interval_s:g} s" if interval_s else "at intervals"
    every += f", priority {priority}" if priority else ""
    lines = [
        "",
        f"Short text requests beside the load (one at a time, {every}, one token out; TTFT in ms): what a user "
        "of the same model waits for while the load keeps the server busy",
        "",
        f"| target | {level_name} | sent | failed | no text | TTFT mean | p50 | p95 | p99 | max | server stages p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for level, name, p in probed:
        t = p["ttft_ms"]
        stages = ", ".join(f"{stage} {fmt_num(s['p50'])}" for stage, s in p.get("stage_ms", {}).items()) or "-"
        lines.append(
            f"| {name} | {level} | {p['sent']} | {p['failed']} | {p.get('without_text', '-')} | "
            + " | ".join(fmt_num(t[k]) for k in ("mean", "p50", "p95", "p99", "max"))
            + f" | {stages} |"
        )
    return lines


def handicaps(results: Mapping[str, Any]) -> dict[str, str]:
    """The targets of a result that ran handicapped, and why: those it names (`--handicap NAME=WHY`), and
    those a run before SESSION_FIX started itself (`--start KIND`)."""
    found = dict(results.get("handicapped") or {})
    date = results.get("date")
    if date and datetime.datetime.fromisoformat(date) < SESSION_FIX:
        args = shlex.split(results.get("command", ""))
        values = [b for a, b in itertools.pairwise(args) if a == "--start"]
        values += [a.removeprefix("--start=") for a in args if a.startswith("--start=")]
        for value in values:
            found.setdefault(value.partition(":")[0], SESSION_HANDICAP)
    return found


def _ratio(a: float | None, b: float | None) -> str:
    # A CPU above rest can come out at or below zero when the rest reading was noisy: no ratio then.
    if a is None or b is None or math.isnan(a) or math.isnan(b) or a <= 0 or b <= 0:
        return "-"
    return f"{a / b:.2f}x"


def ratio(a: float | None, b: float | None, handicapped: bool) -> str:
    """a / b; flagged when either side ran handicapped: such a ratio is not like for like."""
    plain = _ratio(a, b)
    return f"⚠ {plain} (handicapped)" if handicapped and plain != "-" else plain


def handicap_notes(handicapped: Mapping[str, str]) -> list[str]:
    """The lines under a table of ratios that says which targets ran handicapped, and how."""
    if not handicapped:
        return []
    why = "; ".join(f"`{name}`: {reason}" for name, reason in handicapped.items())
    return ["", f"**⚠ Handicapped targets**, their ratios favour the other side by an unknown factor: {why}."]


def _vs_graph(results: dict[str, Any], level_name: str, speech: bool) -> list[str]:
    """The graph over each other target at each level: the ratios the notes quote, stated here once."""
    others = [name for name in results["targets"] if name != "graph"]
    if "graph" not in results["targets"] or not others:
        return []
    handicapped = handicaps(results)
    latency, label = ("ttfa_ms", "TTFA") if speech else ("ttft_ms", "TTFT")
    lines = [
        "",
        f"Graph / other target at the same level (req/s below 1x: the graph serves less; {label} p50 and CPU "
        "above 1x: the graph answers later, spends more per request)",
        "",
        f"| other | {level_name} | req/s ratio | {label} p50 ratio | {CPU_COLUMN} ratio | {ABOVE_REST_COLUMN} ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for level in results["levels"]:
        graph = results["results"]["graph"][level]
        for name in others:
            other = results["results"][name][level]
            flag = "graph" in handicapped or name in handicapped
            lines.append(
                f"| {name} | {level} | {ratio(graph['request_throughput'], other['request_throughput'], flag)} "
                f"| {ratio(graph[latency]['p50'], other[latency]['p50'], flag)} "
                f"| {ratio(cpu.outside_engine_ms(graph), cpu.outside_engine_ms(other), flag)} "
                f"| {ratio(cpu.above_rest_ms(graph), cpu.above_rest_ms(other), flag)} |"
            )
    return lines + handicap_notes({n: r for n, r in handicapped.items() if n in results["targets"]})


def _stalled_times(rows: list[Row]) -> str:
    # Runs with the kernel's stamps probed `/health` from a process of their own; runs before, on this loop.
    if any("health_stamped_ms" in m for _, _, m in rows):
        return "request timestamps (not `/health`'s: probed from a process of its own)"
    return "timestamps and /health latencies"


def markdown(results: dict[str, Any]) -> str:
    level_name = "concurrency" if results["mode"] == "concurrency" else "req/s offered"
    rows: list[Row] = [
        (level, name, results["results"][name][level]) for level in results["levels"] for name in results["targets"]
    ]
    speech = results.get("endpoint") == "speech"
    lines = _speech_table(level_name, rows) if speech else _text_tables(results, level_name, rows)
    lines += _vs_graph(results, level_name, speech)
    lines += _stamped_health_table(level_name, rows)
    lines += _text_probe_table(level_name, rows, results["config"])
    lines += cpu.markdown(level_name, rows)
    stages = [stage for stage in STAGE_HEADERS.values() if any(stage in m["stage_ms"] for _, _, m in rows)]
    if stages:
        lines += ["", "Stage times the server reports (X-*-Time headers), ms: p50 / p99", ""]
        lines += [f"| target | {level_name} | " + " | ".join(stages) + " |", "|---|---:|" + "---:|" * len(stages)]
        for level, name, m in rows:
            cells = [_num_pair(m["stage_ms"].get(stage)) for stage in stages]
            lines.append(f"| {name} | {level} | " + " | ".join(cells) + " |")
    errors = [
        f"{name} @ {level}: {m['errors']} in {_num_pair(m['failed_latency_ms'])} ms (p50 / p99)"
        for level, name, m in rows
        if m["errors"]
    ]
    rejections = [
        f"{name} @ {level}: {m['rejected']} in {_num_pair(m['rejected_latency_ms'])} ms (p50 / p99)"
        for level, name, m in rows
        if m.get("rejected")
    ]
    if rejections:
        lines += ["", "Rejections (HTTP 503): " + "; ".join(rejections)]
    if errors:
        expected = " (--dataset long: prompts beyond the context are refused by design)"
        lines += [
            "",
            "Failures" + (expected if results["config"].get("dataset") == "long" else "") + ": " + "; ".join(errors),
        ]
    lag = max((m["client_loop_lag_ms"]["max"] or 0.0 for _, _, m in rows), default=0.0)
    lines += ["", f"Client event-loop lag, max: {fmt_num(lag, 1)} ms (times above are only as exact as that)"]
    if lag > STALLED_MS:
        lines.append(
            f"**The client stalled**: {_stalled_times(rows)} taken meanwhile are inflated by up to that much. Either "
            "the client lacked CPU (try `nice -n -10 python -m load.bench ...`) or the whole machine froze under "
            "load (2-core VMs do); a client on another machine avoids both."
        )
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any], out_dir: Path, render: Callable[[dict[str, Any]], str] = markdown) -> None:
    """results.json, and results.md as `render` writes it (other load tools pass their own)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(jsonable(results), indent=2) + "\n")
    (out_dir / "results.md").write_text(render(results))


def save(
    results: dict[str, Any], opts: Any, module: str, argv: Sequence[str] | None, out_dir: Path,
    render: Callable[[dict[str, Any]], str], **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """`results` with the command, date, machine, options and label; written under `out_dir` and printed."""
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()}
    results.update(run_meta(module, list(argv) if argv is not None else None), config=config, label=opts.label, **extra)
    write(results, out_dir, render)
    print(render(results))
    print(f"results in {out_dir}/")
    return results
