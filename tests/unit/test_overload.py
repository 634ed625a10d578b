"""The overload run: per-level accounting, goodput and RSS, by hand and end to end against the ingress app."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from load.bench.client import RequestRecord
from load.bench.runner import Cell, CellResult
from load.overload import build, level_summary, main, markdown, parse_args
from load.rss import MIB, RssSample, StageRss
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.bench_support import serving

OPENAI_503 = '{"error":{"message":"overloaded","type":"ServiceUnavailable","param":null,"code":"overloaded"}}'


def ok(first_s: float, latency: float) -> RequestRecord:
    return RequestRecord(0.0, 16, 200, latency=latency, content_times=[first_s, latency], output_tokens=2)


def rejected(latency: float) -> RequestRecord:
    return RequestRecord(0.0, 16, 503, error="HTTP 503", detail=OPENAI_503, latency=latency)


def cell(level: float, started_at: float, records: list[RequestRecord], duration_s: float = 2.0) -> CellResult:
    return CellResult(Cell(0, level, "target"), started_at, duration_s, records, [], [0.001, 0.004])


RECORDS = [
    ok(0.2, 0.4), ok(1.5, 2.0), rejected(0.01), rejected(0.03),
    RequestRecord(0.0, 16, None, error="ReadTimeout", detail="", latency=60.0),
]  # fmt: skip


def test_level_summary_by_hand() -> None:
    summary = level_summary(cell(5.0, 0.0, RECORDS), sent=5, ttft_slo_ms=1000, arrivals_s=1.0)
    assert (summary["sent"], summary["succeeded"], summary["rejected"]) == (5, 2, 2)
    assert summary["errors"] == {"timeout (ReadTimeout)": 1}
    assert summary["balanced"] and not summary["clean"]
    assert summary["offered_rate"] == 5.0  # 5 sent over 1 s of arrivals
    assert summary["throughput"] == 1.0  # 2 successes over 2 s of wall time
    assert summary["goodput"] == 0.5  # only the first within 1000 ms
    assert summary["ttft_ms"]["p50"] == pytest.approx(850.0)
    assert summary["ttft_ms"]["p99"] == pytest.approx(200 + 1300 * 0.99)
    assert summary["rejection_latency_ms"]["p50"] == pytest.approx(20.0)
    assert summary["rejection_latency_ms"]["p99"] == pytest.approx(10 + 20 * 0.99)
    assert summary["client_loop_lag_ms"]["max"] == pytest.approx(4.0)


def test_a_request_started_but_never_recorded_unbalances_the_level() -> None:
    summary = level_summary(cell(1.0, 0.0, [ok(0.1, 0.2)]), sent=2, ttft_slo_ms=1000, arrivals_s=1.0)
    assert not summary["balanced"] and not summary["clean"]


def test_levels_with_peak_rss_against_the_first() -> None:
    opts = parse_args(["--target", "http://x", "--capacity", "10", "--multipliers", "1", "3", "--duration", "1"])
    cells = [cell(10.0, 0.0, [ok(0.1, 0.2)]), cell(30.0, 5.0, [ok(0.1, 0.2), rejected(0.01)])]
    samples = [RssSample(at, {"llm-app:llm": StageRss(mib * MIB, 1)})
               for at, mib in ((0.0, 2000), (1.0, 2100), (5.0, 2100), (6.0, 3150), (7.5, 2500))]  # fmt: skip
    result = build(opts, 10.0, cells, [1, 2], samples)
    assert "capacity_phase" not in result
    assert [level["rate"] for level in result["levels"]] == [10.0, 30.0]
    assert result["levels"][0]["rss"]["llm-app:llm"]["peak_mib"] == 2100
    assert result["levels"][1]["rss"]["llm-app:llm"]["peak_mib"] == 3150  # the sample at 7.5 s is after the level
    assert result["clean"]
    page = markdown(result)
    assert "| llm-app:llm | 2,100 (1.00x) | 3,150 (1.50x) |" in page
    assert "| 3x | 2.00 | 2 | 1 | 1 | 0 | yes |" in page
    assert "exactly one success or clean rejection: yes" in page


@pytest.fixture
def url(services: Services) -> Iterator[str]:
    with serving(create_app(services)) as base_url:
        yield base_url


def test_capacity_then_levels_end_to_end(url: str, tmp_path: Path) -> None:
    result = main([
        "--target", url, "--capacity-concurrency", "2", "--capacity-duration", "0.3", "--multipliers", "0.5", "1",
        "--duration", "0.4", "--input-len", "16", "--output-len", "4", "--warmup", "1", "--out", str(tmp_path),
        "--no-progress",
    ])  # fmt: skip
    assert result["capacity"] > 0
    assert result["capacity_phase"]["succeeded"] > 0
    assert [level["multiplier"] for level in result["levels"]] == [0.5, 1.0]
    for level in result["levels"]:
        assert level["clean"] and level["sent"] == level["succeeded"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["kind"] == "overload"
    assert "Every request got exactly one success" in (tmp_path / "results.md").read_text()


def test_capacity_only(url: str, tmp_path: Path) -> None:
    result = main([
        "--target", url, "--capacity-only", "--capacity-concurrency", "1", "--capacity-duration", "0.2",
        "--input-len", "16", "--output-len", "4", "--warmup", "0", "--out", str(tmp_path), "--no-progress",
    ])  # fmt: skip
    assert result["levels"] == []
    assert markdown(result).startswith("Capacity (measured): ")


@pytest.mark.parametrize(
    "argv",
    [
        ["--capacity", "5"],
        ["--target", "http://x", "--capacity", "0"],
        ["--target", "http://x", "--multipliers", "1", "-2"],
        ["--target", "http://x", "--capacity", "5", "--capacity-only"],
        ["--target", "http://x", "--dataset", "image", "--endpoint", "completions"],
    ],
)
def test_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
