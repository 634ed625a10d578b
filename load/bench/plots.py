"""PNG plots of a run's results (the JSON document of `report.build`): the bench's own, and the
smaller ones docs/benchmarks.md shows (`load_vs_level`, `health_per_second`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on benchmark machines

import matplotlib.pyplot as plt

# Per endpoint: (metric, title, log scale). Underruns are often 0, which a log scale cannot show.
PANELS = {
    "text": (("ttft_ms", "TTFT (ms)", True), ("tpot_ms", "TPOT (ms)", True), ("itl_ms", "ITL (ms)", True),
             ("e2el_ms", "E2EL (ms)", True)),
    "speech": (("ttfa_ms", "TTFA (ms)", True), ("e2el_ms", "E2EL (ms)", True), ("rtf", "RTF", True),
               ("underrun_ms", "underrun (ms)", False)),
}  # fmt: skip
STYLES = {"p50": ("-", "o"), "p90": ("--", "s"), "p99": (":", "^")}


def _as_floats(values: list[float | None]) -> list[float]:
    """The JSON document has null for an empty summary; matplotlib leaves NaN points out."""
    return [float("nan") if v is None else v for v in values]


def latency_vs_level(results: dict[str, Any], path: Path) -> None:
    """P50/P90/P99 of TTFT, TPOT, ITL and E2EL (speech: TTFA, E2EL, RTF and underrun) against the load
    level, one colour per target."""
    levels = [float(level) for level in results["levels"]]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = PANELS["speech" if results.get("endpoint") == "speech" else "text"]
    for ax, (key, title, log) in zip(axes.flat, panels, strict=True):
        for i, name in enumerate(results["targets"]):
            per_level = [results["results"][name][level][key] for level in results["levels"]]
            for q, (line, marker) in STYLES.items():
                values = _as_floats([m[q] for m in per_level])
                ax.plot(levels, values, line, marker=marker, color=colors[i % len(colors)], label=f"{name} {q}")
        ax.set_title(title)
        ax.set_yscale("log" if log else "linear")
        ax.set_xticks(levels)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("concurrency" if results["mode"] == "concurrency" else "request rate (req/s)")
    axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def health_over_time(results: dict[str, Any], path: Path) -> None:
    """Every /health probe on the run's time axis; the load cells are shaded and labelled."""
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = list(results["targets"])
    for i, name in enumerate(names):
        samples = results["health_timeline"][name]
        ax.plot([s[0] for s in samples], [s[1] for s in samples], ".", markersize=3,
                color=colors[i % len(colors)], label=name)  # fmt: skip
    _shade_cells(ax, results["cells"], {name: colors[i % len(colors)] for i, name in enumerate(names)})
    ax.set_yscale("log")
    ax.set_xlabel("time since the first load cell (s)")
    ax.set_ylabel("/health latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _shade_cells(ax: Any, cells: list[dict[str, Any]], colors: dict[str, str]) -> None:
    """Each load cell as a band in its target's colour, labelled with its level."""
    for cell in cells:
        color = colors[cell["target"]]
        ax.axvspan(cell["start_s"], cell["start_s"] + cell["duration_s"], color=color, alpha=0.08)
        ax.text(cell["start_s"], 1.0, f" {cell['level']}", transform=ax.get_xaxis_transform(), fontsize=7,
                va="top", color=color)  # fmt: skip


def _colors(names: list[str]) -> dict[str, str]:
    """One colour per target, the same on every plot of a page: graph, vllm and baseline keep theirs."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    known = ["graph", "vllm", "baseline"]
    others = [name for name in names if name not in known]
    return {name: cycle[(known.index(name) if name in known else 3 + others.index(name)) % len(cycle)]
            for name in names}  # fmt: skip


def load_vs_level(results: dict[str, Any], path: Path) -> None:
    """Two panels against the load level, the targets side by side: successful req/s, and TTFT (speech:
    TTFA) p50 (solid) and p99 (dotted)."""
    levels = [float(level) for level in results["levels"]]
    speech = results.get("endpoint") == "speech"
    latency, label = ("ttfa_ms", "TTFA (ms)") if speech else ("ttft_ms", "TTFT (ms)")
    colors = _colors(list(results["targets"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, color in colors.items():
        per_level = [results["results"][name][level] for level in results["levels"]]
        left.plot(levels, _as_floats([m["request_throughput"] for m in per_level]), "-o", color=color, label=name)
        for q, line in (("p50", "-o"), ("p99", ":^")):
            values = _as_floats([m[latency][q] for m in per_level])
            right.plot(levels, values, line, color=color, label=f"{name} {q}")
    left.set_title("throughput (successful req/s)")
    left.set_ylim(bottom=0)
    right.set_title(f"{label}, p50 and p99")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xlabel("concurrency" if results["mode"] == "concurrency" else "offered load (req/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [f"{level:g}" for level in levels])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def health_per_second(results: dict[str, Any], path: Path) -> None:
    """/health latency over the run from its per-second series (report.build's `health_series`): the
    median of each second as a line, its slowest probe as dots; the load cells shaded and labelled."""
    colors = _colors(list(results["targets"]))
    fig, ax = plt.subplots(figsize=(11, 4))
    for name, color in colors.items():
        series = results["health_series"][name]
        middles = [row[0] + 0.5 for row in series]  # a second's values belong to its middle
        line_x: list[float] = []
        line_y: list[float] = []
        for x, row in zip(middles, series, strict=True):
            if line_x and x - line_x[-1] > 1.5:  # the target was idle: no line across the gap
                line_x.append(float("nan"))
                line_y.append(float("nan"))
            line_x.append(x)
            line_y.append(row[2])
        ax.plot(line_x, line_y, "-", color=color, linewidth=1, label=f"{name}: p50 of each second (dots: max)")
        ax.plot(middles, [row[3] for row in series], ".", color=color, markersize=3)
    _shade_cells(ax, results["cells"], colors)
    ax.set_yscale("log")
    ax.set_xlabel("time since the first load cell (s); shaded: a target under load, labelled with the level")
    ax.set_ylabel("/health latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results: dict[str, Any], out_dir: Path) -> list[Path]:
    paths = [out_dir / "latency_vs_level.png", out_dir / "health_over_time.png"]
    latency_vs_level(results, paths[0])
    health_over_time(results, paths[1])
    return paths
