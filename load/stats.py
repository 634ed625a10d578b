"""Percentile summaries shared by the load scripts."""

from __future__ import annotations

import math
import statistics

import numpy as np


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), NaN for no values."""
    return float(np.percentile(values, q)) if values else float("nan")


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


def fmt_num(value: float | None, digits: int = 1) -> str:
    """A report's number with thousands separators, "-" for none (None or NaN)."""
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"
