"""Pooling rounds into one result per target and level, JSON-safe output and the markdown tables."""

from __future__ import annotations

import json

import pytest

from load.bench import report
from load.bench.client import RequestRecord
from load.bench.health import HealthSample
from load.bench.runner import Cell, CellResult, Workload


def ok(ttft: float) -> RequestRecord:
    return RequestRecord(sent_at=0.0, input_len=4, status=200, latency=ttft + 0.1, content_times=[ttft, ttft + 0.1],
                         prompt_tokens=4, output_tokens=2, stage_ms={"tokenizer": ttft * 10})  # fmt: skip


def cell(round_: int, target: str, records: list[RequestRecord], started_at: float) -> CellResult:
    health = [HealthSample(started_at, 0.002, 200, stamped=0.0005), HealthSample(started_at + 0.1, 0.004, 503)]
    return CellResult(Cell(round_, 2.0, target), started_at, 1.0, records, health, [0.001, 0.003])


def test_rounds_are_pooled_and_nan_becomes_null() -> None:
    workload = Workload(mode="concurrency", levels=(2.0,), duration_s=1.0, rounds=2)
    cells = [
        cell(0, "a", [ok(0.1)], 10.0),
        cell(0, "b", [], 11.0),
        cell(1, "a", [ok(0.3)], 12.0),
        cell(1, "b", [], 13.0),
    ]
    targets = {"a": {"url": "http://a"}, "b": {"url": "http://b"}}
    results = report.build(cells, workload, targets, {}, {})
    a = results["results"]["a"]["2"]
    assert (a["completed"], a["duration_s"], a["request_throughput"]) == (2, 2.0, 1.0)
    assert a["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert (a["health_ms"]["n"], a["health_ms"]["failures"]) == (4, 2)
    assert (a["health_stamped_ms"]["n"], a["health_stamped_ms"]["p99"], a["health_stamped_ms"]["unstamped"]) == (
        2, pytest.approx(0.5), 2)  # fmt: skip
    assert [c["start_s"] for c in results["cells"]] == [0.0, 1.0, 2.0, 3.0]
    assert results["health_timeline"]["a"] == [[0.0, 2.0, 200], [0.1, 4.0, 503], [2.0, 2.0, 200], [2.1, 4.0, 503]]

    safe = report.jsonable(results)
    assert safe["results"]["b"]["2"]["ttft_ms"]["p50"] is None  # no request: NaN in, null out
    json.dumps(safe, allow_nan=False)
    table = report.markdown(safe)
    assert "| a | 2 | 2 | 0 | 1.00 | 2.0 | - | 3.00 | 4.00 | 4.00 | 4.00 |" in table
    assert "| b | 2 | - / - / - / - |" in table
    assert "| a | 2 | 2.00 / 2.98 |" in table  # tokenizer stage: 1 and 3 ms
    assert "| b | 2 | - |" in table
    assert "| a | 2 | 2 | 2 | 0.50 | 0.50 | 0.50 | 0.50 |" in table  # `/health` by the kernel's stamps
    assert "| b | 2 | 2 | 2 |" in table
    assert "Client event-loop lag, max: 3.0 ms" in table
    assert "stalled" not in table
    assert "ratio" not in table  # no target named graph
    cells[0].loop_lag.append(0.2)
    stalled = report.jsonable(report.build(cells, workload, targets, {}, {}))
    assert "**The client stalled**: request timestamps (not `/health`'s" in report.markdown(stalled)
    for level in stalled["results"].values():  # a run from before /health left the client's loop
        for m in level.values():
            del m["health_stamped_ms"]
    assert "**The client stalled**: timestamps and /health latencies taken" in report.markdown(stalled)


def spoken(ttfa: float, late: float) -> RequestRecord:
    """1 s of 24 kHz audio in two chunks, the second `late` seconds after a real-time player needs it."""
    return RequestRecord(sent_at=0.0, input_len=120, status=200, latency=ttfa + 0.5 + late,
                         content_times=[ttfa, ttfa + 0.5 + late], chunk_bytes=[24000, 24000], sample_rate=24000,
                         stage_ms={"tokenizer": 1.0, "vocoder_first_chunk": 3.0})  # fmt: skip


def test_speech_tables() -> None:
    workload = Workload(mode="concurrency", levels=(2.0,), duration_s=1.0, rounds=2, endpoint="speech")
    rejected = RequestRecord(sent_at=0.0, input_len=120, status=503, error="HTTP 503", latency=0.004)
    cells = [cell(0, "a", [spoken(0.1, 0.0), rejected], 10.0), cell(1, "a", [spoken(0.3, 0.2)], 12.0)]
    results = report.jsonable(report.build(cells, workload, {"a": {"url": "http://a"}}, {}, {}, 150.0))
    a = results["results"]["a"]["2"]
    assert (a["completed"], a["failed"], a["rejected"], a["underrun_rate"]) == (2, 0, 1, 0.5)
    assert (a["audio_throughput"], a["rtf"]["p50"], a["underrun_ms"]["p99"]) == pytest.approx((1.0, 0.8, 198.0))
    assert [(c["rejected"], c["ttfa_p50_ms"], c["underrun_rate"]) for c in results["cells"]] == [
        (1, 100.0, 0.0), (0, 300.0, 1.0),
    ]  # fmt: skip
    json.dumps(results, allow_nan=False)
    table = report.markdown(results)
    assert "late by more than 150 ms" in table
    assert (
        "| target | concurrency | ok | failed | rejected | req/s | audio s/s | TTFA p50 | TTFA p99 | RTF p50 | RTF p99 "
        "| underrun rate | underrun p99 | /health p50 | p99 | max | CPU ms/req outside engine | above rest |" in table
    )
    # Two streams: flagged in the row and loudly under the table.
    assert (
        "| a | 2 | 2 ⚠ | 0 | 1 | 1.00 | 1.00 | 200.0 | 298.0 | 0.800 | 0.996 | 0.500 | 198.0 | 3.00 | 4.00 | 4.00 "
        "| - | - |" in table
    )
    assert "**Too few streams** (fewer than 30 succeeded;" in table and "a @ 2: 2" in table
    assert "| a | 2 | 200.0 / 200.0 / 280.0 / 298.0 | 800.0 / 800.0 / 960.0 / 996.0 |" in table
    assert "| a | 2 | 1.00 / 1.00 | 3.00 / 3.00 |" in table  # tokenizer, vocoder_first_chunk
    assert "Rejections (HTTP 503): a @ 2: 1 in 4.00 / 4.00 ms" in table
    assert "TPOT" not in table and "Failures" not in table


def test_ratios_to_graph() -> None:
    workload = Workload(mode="concurrency", levels=(2.0,), duration_s=1.0, rounds=1)
    cells = [cell(0, "graph", [ok(0.3)], 10.0), cell(0, "vllm", [ok(0.1), ok(0.1)], 11.0), cell(0, "idle", [], 12.0)]
    targets = {name: {"url": f"http://{name}"} for name in ("graph", "vllm", "idle")}
    table = report.markdown(report.jsonable(report.build(cells, workload, targets, {}, {})))
    assert "| other | concurrency | req/s ratio | TTFT p50 ratio |" in table
    assert "| vllm | 2 | 0.50x | 3.00x |" in table
    assert "| idle | 2 | - | - |" in table  # no requests: no ratio, not a division by zero
    assert "| graph | 2 | 1.00x" not in table

    speech = Workload(mode="concurrency", levels=(2.0,), duration_s=1.0, rounds=1, endpoint="speech")
    cells = [cell(0, "graph", [spoken(0.2, 0.0)], 10.0), cell(0, "baseline", [spoken(0.1, 0.0)], 11.0)]
    targets = {"graph": {"url": "http://g"}, "baseline": {"url": "http://b"}}
    table = report.markdown(report.jsonable(report.build(cells, speech, targets, {}, {})))
    assert "| baseline | 2 | 1.00x | 2.00x |" in table and "TTFA p50 ratio" in table
    assert "Handicapped" not in table


def test_ratios_against_a_handicapped_target_are_flagged() -> None:
    workload = Workload(mode="concurrency", levels=(2.0,), duration_s=1.0, rounds=1)
    cells = [cell(0, "graph", [ok(0.3)], 10.0), cell(0, "vllm", [ok(0.1), ok(0.1)], 11.0)]
    targets = {name: {"url": f"http://{name}"} for name in ("graph", "vllm")}
    results = report.jsonable(report.build(cells, workload, targets, {}, {}))
    results["handicapped"] = {"vllm": "nice 19"}
    table = report.markdown(results)
    assert "| vllm | 2 | ⚠ 0.50x (handicapped) | ⚠ 3.00x (handicapped) |" in table
    assert "**⚠ Handicapped targets**" in table and "`vllm`: nice 19" in table


@pytest.mark.parametrize(
    ("command", "date", "expected"),
    [
        # Before the launcher's fix, a --start target ran in a scheduling autogroup of its own.
        ("python -m load.bench --target graph=http://x --start vllm:c.yaml@a --start=baseline",
         "2026-11-21T21:18:06+00:00", {"vllm", "baseline"}),
        ("python -m load.bench --target graph=http://x --start vllm", "2026-11-23T10:00:00+00:00", set()),
        ("python -m load.bench --target graph=http://x --target b=http://y", "2026-11-21T21:18:06+00:00", set()),
    ],
)  # fmt: skip
def test_handicaps_inferred_from_the_command_and_date(command: str, date: str, expected: set[str]) -> None:
    assert set(report.handicaps({"command": command, "date": date})) == expected
