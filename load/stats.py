"""Percentile summaries shared by the load scripts."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), as numpy's default."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "mean": statistics.fmean(ms) if ms else float("nan"),
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "max": max(ms) if ms else float("nan"),
    }


def fmt_ms(value: float) -> str:
    """A time in milliseconds as the reports print it."""
    return f"{value:.1f}"
