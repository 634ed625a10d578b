"""The metrics of `vllm bench serve`, computed from request records: pure functions, no I/O.

Differences from vLLM, on purpose: TTFT ends at the first chunk that carries text (vLLM's chat
client stops its clock at the role-only first chunk), and ITL counts only gaps between chunks
that carry text.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from load.bench.client import RequestRecord
from load.stats import percentile

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")


def ttft(record: RequestRecord) -> float:
    return record.content_times[0]


def itls(record: RequestRecord) -> list[float]:
    times = record.content_times
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def tpot(record: RequestRecord) -> float | None:
    """(E2EL - TTFT) / (output tokens - 1); undefined for a single output token."""
    if record.latency is None or record.output_tokens is None or record.output_tokens < 2:
        return None
    return (record.latency - ttft(record)) / (record.output_tokens - 1)


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Mean and percentiles in milliseconds (numpy's linear interpolation); NaN when empty."""
    ms = [s * 1000 for s in seconds]
    summary = {"mean": statistics.fmean(ms) if ms else float("nan")}
    summary.update({f"p{q}": percentile(ms, q) for q in PERCENTILES})
    return summary


def parse_slos(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> `{"ttft": 500.0, "tpot": 50.0}` (milliseconds), as vLLM's --goodput."""
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"invalid SLO {item!r}: expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
        slos[name] = float(value)
        if slos[name] < 0:
            raise ValueError(f"invalid SLO {item!r}: the limit must not be negative")
    return slos


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """A successful request within every SLO. As vLLM, a request with one output token has TPOT 0."""
    if not record.ok or record.latency is None:
        return False
    values = {"ttft": ttft(record), "tpot": tpot(record) or 0.0, "e2el": record.latency}
    return all(values[name] * 1000 <= limit for name, limit in slos_ms.items())


def compute(records: Sequence[RequestRecord], duration_s: float, slos_ms: dict[str, float]) -> dict[str, Any]:
    """Throughputs over `duration_s` (time with load on), latency summaries of successful requests."""
    good = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    total_input = sum(r.prompt_tokens or 0 for r in good)
    total_output = sum(r.output_tokens or 0 for r in good)
    tpots = [t for r in good if (t := tpot(r)) is not None]
    stages = sorted({stage for r in good for stage in r.stage_ms})
    return {
        "completed": len(good),
        "failed": len(failed),
        "errors": dict(Counter(r.error for r in failed)),
        # A count says that requests failed; the details say why.
        "error_details": sorted({f"{r.error}: {r.detail}" for r in failed})[:5],
        "duration_s": duration_s,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(good) / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "request_goodput": sum(meets_slos(r, slos_ms) for r in good) / duration_s if slos_ms else None,
        "ttft_ms": summarize_ms([ttft(r) for r in good]),
        "tpot_ms": summarize_ms(tpots),
        "itl_ms": summarize_ms([gap for r in good for gap in itls(r)]),
        "e2el_ms": summarize_ms([r.latency for r in good if r.latency is not None]),
        # Rejections are measured too: how long a long over-context prompt takes to be refused.
        "failed_latency_ms": summarize_ms([r.latency for r in failed if r.latency is not None]),
        "stage_ms": {s: summarize_ms([r.stage_ms[s] / 1000 for r in good if s in r.stage_ms]) for s in stages},
    }
