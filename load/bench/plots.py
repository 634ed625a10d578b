"""PNG plots of a run's results (the JSON document of `report.build`)."""

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
    for cell in results["cells"]:
        color = colors[names.index(cell["target"]) % len(colors)]
        ax.axvspan(cell["start_s"], cell["start_s"] + cell["duration_s"], color=color, alpha=0.08)
        ax.text(cell["start_s"], 1.0, f" {cell['level']}", transform=ax.get_xaxis_transform(), fontsize=7,
                va="top", color=color)  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("time since the first load cell (s)")
    ax.set_ylabel("/health latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict[str, Any], out_dir: Path) -> list[Path]:
    paths = [out_dir / "latency_vs_level.png", out_dir / "health_over_time.png"]
    latency_vs_level(results, paths[0])
    health_over_time(results, paths[1])
    return paths
