"""The bench's metrics, text and speech, against hand-computed examples (numpy-style linear percentiles)."""

from __future__ import annotations

import math

import pytest

from load.bench.client import RequestRecord
from load.bench.metrics import (
    Speech,
    compute,
    compute_speech,
    itls,
    meets_slos,
    parse_slos,
    pcm_seconds,
    speech,
    summarize_ms,
    tpot,
    ttft,
    underrun_s,
)


def record(
    times: list[float], latency: float, output_tokens: int, stage_ms: dict[str, float] | None = None
) -> RequestRecord:
    return RequestRecord(
        sent_at=100.0, input_len=10, status=200, latency=latency, content_times=times, prompt_tokens=10,
        output_tokens=output_tokens, stage_ms=stage_ms or {},
    )  # fmt: skip


def failed(latency: float) -> RequestRecord:
    return RequestRecord(sent_at=100.0, input_len=10, status=400, error="HTTP 400", latency=latency)


# A: 5 tokens in 4 chunks; B: 2 tokens; C: 1 token; D: rejected.
A = record([0.2, 0.25, 0.35, 0.5], latency=0.6, output_tokens=5, stage_ms={"tokenizer": 2.0})
B = record([0.1, 0.3], latency=0.3, output_tokens=2, stage_ms={"tokenizer": 4.0})
C = record([0.05], latency=0.05, output_tokens=1)
D = failed(0.01)


def test_ttft_itl_tpot_from_timestamps() -> None:
    assert ttft(A) == 0.2
    assert itls(A) == pytest.approx([0.05, 0.1, 0.15])
    assert tpot(A) == pytest.approx((0.6 - 0.2) / 4)  # output tokens from usage, not the 4 chunks
    assert tpot(B) == pytest.approx(0.2)
    assert itls(C) == []
    assert tpot(C) is None  # one token: no time per output token


def test_summary_percentiles() -> None:
    s = summarize_ms([0.010, 0.040, 0.020, 0.030])
    assert s == pytest.approx({"mean": 25.0, "p50": 25.0, "p90": 37.0, "p99": 39.7})
    assert all(math.isnan(v) for v in summarize_ms([]).values())


def test_compute() -> None:
    m = compute([A, B, C, D], duration_s=2.0, slos_ms={})
    assert (m["completed"], m["failed"], m["errors"]) == (3, 1, {"HTTP 400": 1})
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (30, 8)
    assert m["request_throughput"] == 1.5
    assert m["output_throughput"] == 4.0
    assert m["total_token_throughput"] == 19.0
    assert m["request_goodput"] is None
    assert m["ttft_ms"] == pytest.approx({"mean": 350 / 3, "p50": 100.0, "p90": 180.0, "p99": 198.0})
    assert m["tpot_ms"] == pytest.approx({"mean": 150.0, "p50": 150.0, "p90": 190.0, "p99": 199.0})
    assert m["itl_ms"] == pytest.approx({"mean": 125.0, "p50": 125.0, "p90": 185.0, "p99": 198.5})
    assert m["e2el_ms"] == pytest.approx({"mean": 950 / 3, "p50": 300.0, "p90": 540.0, "p99": 594.0})
    assert m["failed_latency_ms"]["p50"] == pytest.approx(10.0)
    assert m["stage_ms"]["tokenizer"] == pytest.approx({"mean": 3.0, "p50": 3.0, "p90": 3.8, "p99": 3.98})


def test_a_stream_without_text_is_served_with_no_ttft() -> None:
    silent = record([], latency=0.4, output_tokens=3)  # tokens that decode to no text
    m = compute([A, silent], duration_s=1.0, slos_ms={"ttft": 300.0})
    assert (m["completed"], m["failed"], m["without_text"]) == (2, 0, 1)
    assert m["ttft_ms"]["p50"] == pytest.approx(200.0)  # A's alone
    assert tpot(silent) is None
    assert m["request_goodput"] == 1.0  # its end (400 ms) stands in for TTFT: over the SLO
    assert meets_slos(silent, {"ttft": 400.0})


def test_goodput() -> None:
    # A misses ttft, B misses tpot; C meets both (one token counts as TPOT 0, as in vLLM).
    assert compute([A, B, C, D], 2.0, parse_slos(["ttft:150", "tpot:150"]))["request_goodput"] == 0.5
    # Limits are inclusive: B's E2EL is exactly 300 ms.
    assert compute([A, B, C, D], 2.0, {"e2el": 300.0})["request_goodput"] == 1.0
    assert not meets_slos(D, {"e2el": 1000.0})


def test_parse_slos() -> None:
    assert parse_slos(["ttft:500", "tpot:50", "e2el:2000.5"]) == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.5}
    for bad in ["ttft", "itl:5", "ttft:-1"]:
        with pytest.raises(ValueError, match="invalid SLO"):
            parse_slos([bad])
    with pytest.raises(ValueError):
        parse_slos(["ttft:fast"])


# Speech at 8 kHz (16,000 bytes of PCM a second), times that are exact in binary.
RATE = 8000
# Chunk k arrives at TIMES[k] with SIZES[k] bytes; due at 0.25 + audio before it:
# 0.25, 0.375 (on time), 0.625 (0.125 late), 0.75 (0.125 late), 0.875 (0.0625 late).
TIMES = [0.25, 0.375, 0.75, 0.875, 0.9375]
SIZES = [2000, 4000, 2000, 2000, 1000]  # 0.6875 s of audio


def speech_record(times: list[float], sizes: list[int], latency: float) -> RequestRecord:
    return RequestRecord(sent_at=100.0, input_len=120, status=200, latency=latency, content_times=times,
                         chunk_bytes=sizes, sample_rate=RATE, stage_ms={"vocoder_first_chunk": 2.0})  # fmt: skip


def test_underrun_is_the_worst_lateness_against_real_time_from_the_first_chunk() -> None:
    assert underrun_s(TIMES, SIZES, RATE) == 0.125
    assert underrun_s(TIMES[:2], SIZES[:2], RATE) == 0.0  # on time
    assert underrun_s([0.25, 0.26], [8000, 8000], RATE) == 0.0  # early chunks are not negative lateness
    assert underrun_s([], [], RATE) == 0.0
    # No rebuffering: the player does not wait for a late chunk, so lateness adds up (0.125, then 0.25).
    assert underrun_s([0.0, 0.25, 0.5], [2000, 2000, 2000], RATE) == 0.25


def test_speech_measures() -> None:
    assert pcm_seconds(48000, 24000) == 1.0
    stream = speech(speech_record(TIMES, SIZES, latency=1.375))
    assert stream == Speech(audio_s=0.6875, rtf=2.0, underrun_s=0.125)
    assert speech(failed(0.01)) is None
    assert speech(A) is None  # a text record has no audio


def test_compute_speech() -> None:
    slow = speech_record(TIMES, SIZES, latency=1.375)  # TTFA 250 ms, RTF 2, underrun 125 ms
    fast = speech_record([0.125, 0.25], [8000, 8000], latency=0.5)  # TTFA 125 ms, 1 s of audio: RTF 0.5
    rejected = RequestRecord(sent_at=100.0, input_len=120, status=503, error="HTTP 503", latency=0.002)
    m = compute_speech([slow, fast, rejected, failed(0.01)], duration_s=2.0, underrun_threshold_ms=100.0)
    assert (m["completed"], m["failed"], m["rejected"], m["errors"]) == (2, 1, 1, {"HTTP 400": 1})
    assert m["rejected_latency_ms"]["p50"] == pytest.approx(2.0)
    assert m["failed_latency_ms"]["p50"] == pytest.approx(10.0)
    assert (m["total_input_chars"], m["total_audio_s"]) == (240, 1.6875)
    assert (m["request_throughput"], m["audio_throughput"]) == (1.0, 1.6875 / 2)
    assert m["ttfa_ms"] == pytest.approx({"mean": 187.5, "p50": 187.5, "p90": 237.5, "p99": 248.75})
    assert m["e2el_ms"]["mean"] == pytest.approx(937.5)
    assert m["rtf"] == pytest.approx({"mean": 1.25, "p50": 1.25, "p90": 1.85, "p99": 1.985})
    assert m["underrun_ms"] == pytest.approx({"mean": 62.5, "p50": 62.5, "p90": 112.5, "p99": 123.75})
    assert (m["underrun_threshold_ms"], m["underrun_rate"]) == (100.0, 0.5)
    assert m["stage_ms"]["vocoder_first_chunk"]["p50"] == pytest.approx(2.0)
    # Strictly above the threshold: 125 ms late is no underrun at 125 ms.
    assert compute_speech([slow, fast], 2.0, underrun_threshold_ms=125.0)["underrun_rate"] == 0.0
    assert compute_speech([rejected], 2.0, 100.0)["underrun_rate"] is None
