"""Every request ends as a success, a clean rejection or an error of one kind."""

from __future__ import annotations

import pytest

from load.bench.client import RequestRecord
from load.outcomes import Accounting, account, outcome

OPENAI_503 = '{"error":{"message":"overloaded","type":"ServiceUnavailable","param":null,"code":"overloaded"}}'


def rec(status: int | None = 200, error: str | None = None, detail: str | None = None) -> RequestRecord:
    return RequestRecord(sent_at=0.0, input_len=1, status=status, error=error, detail=detail, latency=0.1)


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        (rec(), "ok"),
        (rec(503, "HTTP 503", OPENAI_503), "rejected"),
        (rec(429, "HTTP 429", ' { "error" : {"message": "' + "x" * 300), "rejected"),  # cut at 300 characters
        (rec(503, "HTTP 503", "Request dropped due to backpressure"), "HTTP 503 (not OpenAI JSON)"),
        (rec(500, "HTTP 500", OPENAI_503), "HTTP 500"),
        (rec(400, "HTTP 400", '{"error":{}}'), "HTTP 400"),
        (rec(None, "ReadTimeout", ""), "timeout (ReadTimeout)"),
        (rec(None, "RemoteProtocolError", "peer closed"), "connection (RemoteProtocolError)"),
        (rec(200, "stream", "stream ended without [DONE]"), "broken stream"),
    ],
)
def test_outcome(record: RequestRecord, kind: str) -> None:
    assert outcome(record) == kind


def test_accounting_counts_each_request_once() -> None:
    records = [rec(), rec(), rec(503, "HTTP 503", OPENAI_503), rec(None, "ReadTimeout", "t")]
    acc = account(records)
    assert acc == Accounting(4, 2, 1, {"timeout (ReadTimeout)": 1}, ["timeout (ReadTimeout): t"])
    assert acc.balanced
    assert not acc.clean


def test_clean_needs_no_errors_and_every_started_request_accounted_for() -> None:
    records = [rec(), rec(503, "HTTP 503", OPENAI_503)]
    assert account(records).clean
    lost = account(records, sent=3)  # one request started but never came back
    assert not lost.balanced
    assert not lost.clean
