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
    health = [HealthSample(started_at, 0.002, 200), HealthSample(started_at + 0.1, 0.004, 503)]
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
    assert "Client event-loop lag, max: 3.0 ms" in table
    assert "stalled" not in table
    cells[0].loop_lag.append(0.2)
    assert "**The client stalled**" in report.markdown(report.jsonable(report.build(cells, workload, targets, {}, {})))
