"""The metrics of `vllm bench serve`, and for speech those of vLLM-Omni's TTS benchmarks, computed
from request records: pure functions, no I/O.

Differences from vLLM, on purpose: TTFT ends at the first chunk that carries text (vLLM's chat
client stops its clock at the role-only first chunk), and ITL counts only gaps between chunks
that carry text.

Speech, per stream of 16-bit mono PCM: TTFA is TTFT with audio as the content (the first non-empty
chunk); audio duration is bytes / 2 / sample rate; RTF is E2EL / audio duration (below 1: faster
than real time). Underrun is the worst lateness of a chunk for a player that starts playing at the
first chunk and then plays in real time without ever pausing to rebuffer (`underrun_s`).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from load.bench.client import RequestRecord
from load.stats import percentile

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")
PCM_BYTES_PER_SAMPLE = 2  # 16-bit mono
UNDERRUN_THRESHOLD_MS = 100.0
# Successful speech streams below which a cell's TTFA, RTF and underrun percentiles are flagged: at 4-8
# streams a p99 is the worst stream, and one slow stream moves a p50.
MIN_STREAMS = 30
# HTTP 503: the server refused the request at capacity (with Retry-After): load shed, not a failure.
REJECTED = 503


def ttft(record: RequestRecord) -> float:
    return record.content_times[0]


def ttfts(records: Sequence[RequestRecord]) -> list[float]:
    """TTFT of each record with content. A complete stream whose tokens decode to no text (a random
    model's special tokens) is served but has no TTFT: it counts in `without_text`, not here."""
    return [ttft(r) for r in records if r.content_times]


def without_text(records: Sequence[RequestRecord]) -> int:
    """Successful streams whose tokens decode to no text: served, with no TTFT."""
    return sum(r.ok and not r.content_times for r in records)


def itls(record: RequestRecord) -> list[float]:
    times = record.content_times
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def tpot(record: RequestRecord) -> float | None:
    """(E2EL - TTFT) / (output tokens - 1); undefined for a single output token."""
    if record.latency is None or record.output_tokens is None or record.output_tokens < 2 or not record.content_times:
        return None
    return (record.latency - ttft(record)) / (record.output_tokens - 1)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean and percentiles (numpy's linear interpolation); NaN when empty."""
    summary = {"mean": statistics.fmean(values) if values else float("nan")}
    summary.update({f"p{q}": percentile(list(values), q) for q in PERCENTILES})
    return summary


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    return summarize([s * 1000 for s in seconds])


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
    # Without text, the end of the stream is the first thing its reader saw.
    first = ttft(record) if record.content_times else record.latency
    values = {"ttft": first, "tpot": tpot(record) or 0.0, "e2el": record.latency}
    return all(values[name] * 1000 <= limit for name, limit in slos_ms.items())


def _latencies_ms(records: Sequence[RequestRecord]) -> dict[str, float]:
    return summarize_ms([r.latency for r in records if r.latency is not None])


def _failures(failed: Sequence[RequestRecord]) -> dict[str, Any]:
    return {
        "failed": len(failed),
        "errors": dict(Counter(r.error for r in failed)),
        # A count says that requests failed; the details say why.
        "error_details": sorted({f"{r.error}: {r.detail}" for r in failed})[:5],
        # Failures are timed too: e.g. how long a prompt beyond the context takes to be refused.
        "failed_latency_ms": _latencies_ms(failed),
    }


def stages_ms(good: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    """Each stage time the server reported (X-*-Time headers), summarized over the requests that had it."""
    stages = sorted({stage for r in good for stage in r.stage_ms})
    return {s: summarize_ms([r.stage_ms[s] / 1000 for r in good if s in r.stage_ms]) for s in stages}


def compute(records: Sequence[RequestRecord], duration_s: float, slos_ms: dict[str, float]) -> dict[str, Any]:
    """Throughputs over `duration_s` (time with load on), latency summaries of successful requests."""
    good = [r for r in records if r.ok]
    total_input = sum(r.prompt_tokens or 0 for r in good)
    total_output = sum(r.output_tokens or 0 for r in good)
    tpots = [t for r in good if (t := tpot(r)) is not None]
    return {
        "completed": len(good),
        **_failures([r for r in records if not r.ok]),
        "duration_s": duration_s,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(good) / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "request_goodput": sum(meets_slos(r, slos_ms) for r in good) / duration_s if slos_ms else None,
        "without_text": without_text(good),
        "ttft_ms": summarize_ms(ttfts(good)),
        "tpot_ms": summarize_ms(tpots),
        "itl_ms": summarize_ms([gap for r in good for gap in itls(r)]),
        "e2el_ms": _latencies_ms(good),
        "stage_ms": stages_ms(good),
    }


def pcm_seconds(nbytes: int, sample_rate: int) -> float:
    return nbytes / PCM_BYTES_PER_SAMPLE / sample_rate


def underrun_s(times: Sequence[float], sizes: Sequence[int], sample_rate: int) -> float:
    """The worst lateness of a stream's chunks, 0 when none is late. Chunk i arrives at `times[i]` with
    A_i seconds of audio before it; a player started at the first chunk's arrival needs it at
    `times[0] + A_i`. No rebuffering: a chunk late by 0.3 s after one late by 0.2 s makes 0.3 s, not 0.5.
    `sizes` are the chunks' PCM bytes; empty chunks must be left out (they would count as late)."""
    worst = 0.0
    received = 0
    for at, size in zip(times, sizes, strict=True):
        worst = max(worst, at - times[0] - pcm_seconds(received, sample_rate))
        received += size
    return worst


@dataclass(frozen=True)
class Speech:
    """One successful speech stream's audio measures."""

    audio_s: float
    rtf: float
    underrun_s: float


def speech(record: RequestRecord) -> Speech | None:
    """The audio measures of a speech record, None when it has no audio (failed, rejected, text)."""
    if not record.ok or record.sample_rate is None or record.latency is None or not record.chunk_bytes:
        return None
    audio_s = pcm_seconds(sum(record.chunk_bytes), record.sample_rate)
    return Speech(
        audio_s, record.latency / audio_s, underrun_s(record.content_times, record.chunk_bytes, record.sample_rate)
    )


def compute_speech(records: Sequence[RequestRecord], duration_s: float, underrun_threshold_ms: float) -> dict[str, Any]:
    """Throughputs over `duration_s`; TTFA, E2EL, RTF and underrun summaries of successful streams;
    rejections (503) counted apart from failures. The underrun rate is the share of successful
    streams whose underrun exceeds `underrun_threshold_ms`."""
    good = [r for r in records if r.ok]
    streams = [s for r in good if (s := speech(r)) is not None]
    underruns_ms = [s.underrun_s * 1000 for s in streams]
    rejected = [r for r in records if r.status == REJECTED]
    audio_s = sum(s.audio_s for s in streams)
    return {
        "completed": len(good),
        "rejected": len(rejected),
        **_failures([r for r in records if not r.ok and r.status != REJECTED]),
        "rejected_latency_ms": _latencies_ms(rejected),
        "duration_s": duration_s,
        "total_input_chars": sum(r.input_len for r in good),
        "total_audio_s": audio_s,
        "request_throughput": len(good) / duration_s,
        "audio_throughput": audio_s / duration_s,
        "ttfa_ms": summarize_ms(ttfts(good)),
        "e2el_ms": _latencies_ms(good),
        "rtf": summarize([s.rtf for s in streams]),
        "underrun_ms": summarize(underruns_ms),
        "underrun_threshold_ms": underrun_threshold_ms,
        "underrun_rate": sum(u > underrun_threshold_ms for u in underruns_ms) / len(streams) if streams else None,
        "stage_ms": stages_ms(good),
    }
