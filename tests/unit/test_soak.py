"""The soak run's windows, errors and report, by hand and end to end against the ingress app."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from load.bench.client import RequestRecord
from load.rss import MIB, RssSample, StageRss
from load.soak import build, error_list, kind_values, main, markdown, parse_args, since, windows
from serve_app.config import AdmissionConfig
from serve_app.errors import OverloadedError
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import GenerateRequest, GenerationChunk
from tests.unit.bench_support import serving
from tests.unit.conftest import FakeLLM

OPENAI_503 = '{"error":{"message":"overloaded","type":"ServiceUnavailable","param":null,"code":"overloaded"}}'
T0 = 100.0


def ok(sent_at: float, first_s: float, latency: float) -> RequestRecord:
    return RequestRecord(sent_at, 16, 200, latency=latency, content_times=[first_s, latency], output_tokens=2)


RECORDS = {
    "text": [
        ok(100.1, 0.2, 0.5), ok(100.5, 0.4, 0.6), ok(101.2, 0.1, 0.3),
        RequestRecord(102.9, 16, 503, error="HTTP 503", detail=OPENAI_503, latency=0.01),
    ],
    "speech": [ok(100.3, 0.8, 3.0)],
}  # fmt: skip
SAMPLES = [RssSample(at, {"llm-app:llm": StageRss(mib * MIB, 1)})
           for at, mib in ((100.0, 2000), (100.9, 2100), (101.5, 2050), (102.99, 2200), (103.5, 9999))]  # fmt: skip
LAGS = [(100.5, 0.002), (101.5, 0.06)]


def test_windows_by_send_time() -> None:
    first, second, third = windows(T0, 3.0, 1.0, RECORDS, SAMPLES, LAGS)
    assert (first["start_s"], first["end_s"]) == (0.0, 1.0)
    assert first["kinds"]["text"] == {
        "requests": 2, "errors": 0, "error_kinds": {},
        "ttft_ms": {"p50": pytest.approx(300), "p99": pytest.approx(398)},
        "e2el_ms": {"p50": pytest.approx(550), "p99": pytest.approx(599)},
    }  # fmt: skip
    assert first["kinds"]["speech"]["ttfa_ms"] == {"p50": pytest.approx(800), "p99": pytest.approx(800)}
    assert first["rss"]["llm-app:llm"]["start_mib"] == 2000
    assert first["rss"]["llm-app:llm"]["end_mib"] == 2100
    assert first["client_loop_lag_max_ms"] == pytest.approx(2.0)
    assert second["kinds"]["text"]["requests"] == 1
    assert second["kinds"]["speech"]["requests"] == 0
    assert second["client_loop_lag_max_ms"] == pytest.approx(60.0)
    assert third["kinds"]["text"]["errors"] == 1
    assert third["kinds"]["text"]["error_kinds"] == {"rejected": 1}  # a 503 is an error in a soak
    assert third["rss"]["llm-app:llm"]["peak_mib"] == 2200  # the sample after the run is in no window
    assert third["client_loop_lag_max_ms"] is None


def test_the_last_window_takes_late_sends() -> None:
    late = {"text": [ok(T0 + 3.01, 0.1, 0.2)]}
    assert [w["kinds"]["text"]["requests"] for w in windows(T0, 3.0, 1.0, late, [], [])] == [0, 0, 1]


def test_a_last_short_window() -> None:
    assert [(w["start_s"], w["end_s"]) for w in windows(T0, 2.5, 1.0, RECORDS, [], [])] == [
        (0.0, 1.0),
        (1.0, 2.0),
        (2.0, 2.5),
    ]


def test_errors_listed_in_send_order() -> None:
    assert error_list(T0, RECORDS) == [f"text at 2.9 s: rejected: {OPENAI_503}"]


def test_report_first_against_last_window() -> None:
    opts = parse_args(["--rate", "text=3", "speech=0.5", "--capacity", "text=10", "speech=1", "--duration", "3",
                       "--window", "1"])  # fmt: skip
    result = build(opts, T0, RECORDS, SAMPLES, LAGS)
    assert result["utilization"] == pytest.approx(0.8)
    assert result["errors"] == 1
    page = markdown(result)
    assert "(planned utilization 80% of capacity)" in page
    assert "Errors: 1 of 5 requests" in page
    assert "| text | TTFT p50 ms | 300.0 | - | - |" in page
    assert "| text | errors | 0 | 1 | +1 |" in page
    assert "| llm-app:llm | 2,000 | 2,200 | +200.0 | 9,999 |" in page
    assert "| 0-1 | 2 / 0 / 398.0 | 1 / 0 / 800.0 | 2,100 | 2.0 |" in page
    assert "**The client stalled**" in page


def test_streams_without_text_are_served_and_reported() -> None:
    opts = parse_args(["--rate", "text=3", "--duration", "3", "--window", "1"])
    silent = RequestRecord(100.2, 16, 200, latency=0.4, output_tokens=2)
    result = build(opts, T0, {"text": [*RECORDS["text"][:3], silent]}, [], [])
    assert (result["errors"], result["without_text"]) == (0, {"text": 1})
    assert "served streams whose tokens decode to no text (no TTFT): text 1" in markdown(result)


@pytest.mark.parametrize(
    ("items", "message"),
    [(["txt=1"], "KIND one of"), (["text"], "KIND one of"), (["text=x"], "not a number"), (["text=0"], "positive")],
)
def test_bad_kind_values(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kind_values(items, "--rate")


def test_capacity_for_every_rate() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--rate", "text=1", "image=1", "--capacity", "text=5"])


@pytest.fixture
def url(services: Services) -> Iterator[str]:
    with serving(create_app(services)) as base_url:
        yield base_url


def test_text_soak_end_to_end(url: str, tmp_path: Path) -> None:
    result = main(["--url", url, "--rate", "text=20", "--duration", "1", "--window", "0.5", "--input-len", "16",
                   "--output-len", "4", "--rss-interval", "0.2", "--out", str(tmp_path)])  # fmt: skip
    assert result["errors"] == 0
    assert result["requests"]["text"] > 0
    assert [w["start_s"] for w in result["windows"]] == [0.0, 0.5]
    assert sum(w["kinds"]["text"]["requests"] for w in result["windows"]) == result["requests"]["text"]
    assert json.loads((tmp_path / "results.json").read_text())["kind"] == "soak"


def test_a_retried_request_counts_from_its_first_attempt() -> None:
    record = RequestRecord(10.5, 16, 200, latency=0.5, content_times=[0.2, 0.5], output_tokens=2)
    assert since(record, 10.0) is record
    assert (record.sent_at, record.content_times, record.latency) == (10.0, [0.7, 1.0], 1.0)


class RefusesFirst:
    """The fake engine behind an engine queue that is full for the first `refusals` requests."""

    def __init__(self, llm: FakeLLM, refusals: int) -> None:
        self.llm, self.refusals = llm, refusals

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        if self.refusals > 0:
            self.refusals -= 1
            raise OverloadedError("full", code="overloaded", stage="llm", reason="engine_queue_full")
        async for chunk in self.llm.generate(request):
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)


def test_honor_retry_after_sends_a_refused_request_again(services: Services, fake_llm: FakeLLM,
                                                         tmp_path: Path) -> None:  # fmt: skip
    services.args = services.args.model_copy(update={"admission": AdmissionConfig(retry_after_s=0)})
    services.llm = RefusesFirst(fake_llm, refusals=2)
    args = ["--rate", "text=5", "--duration", "0.5", "--input-len", "16", "--output-len", "4", "--out", str(tmp_path)]
    with serving(create_app(services)) as base_url:
        result = main(["--url", base_url, "--honor-retry-after", *args])
    assert result["errors"] == 0 and result["requests"]["text"] > 0
    assert result["retries"] == {"text": 2}
    assert "sent again: text 2" in markdown(result)
