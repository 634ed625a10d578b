"""The message-cost script times every message with both methods and prints one row for each."""

from __future__ import annotations

import pytest

from load import message_cost


def test_every_message_with_both_methods() -> None:
    rows = message_cost.measure(repeat=5)
    assert {(r["message"], r["method"]) for r in rows} == {
        (m, d) for m in message_cost.MESSAGES for d in message_cost.DUMPS
    }
    assert all(r["bytes"] > 0 and r["dumps_us"] > 0 and r["loads_us"] > 0 for r in rows)


def test_prints_a_markdown_table(capsys: pytest.CaptureFixture[str]) -> None:
    message_cost.main(["--repeat", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| message | method |")
    assert len(lines) == 2 + len(message_cost.MESSAGES) * len(message_cost.DUMPS)
