"""One Serve hop's CPU (load/hop_cost.py): the arithmetic and the page's section, from hand-made runs. Its
two deployments need a running cluster: `python -m load.hop_cost` is how they run."""

from __future__ import annotations

from typing import Any

import pytest

from load import benchmarks_page, hop_cost

META = {"command": "python -m load.hop_cost", "date": "2026-01-01T00:00:00+00:00", "machine": "2 cores"}


def run(caller_s: float, callee_s: float, rest_s: float = 0.1, p50: float = 3.0) -> dict[str, Any]:
    return {"wall_s": 1.0, "busy_cpu_s": [caller_s, callee_s], "rest_cpu_s": [rest_s, rest_s],
            "first_item_ms": {"p50": p50}}  # fmt: skip


def test_a_call_costs_its_cpu_above_rest_over_the_calls() -> None:
    assert hop_cost.per_call_ms(run(0.4, 0.3), calls=100) == pytest.approx({"caller": 3.0, "callee": 2.0})


def test_rows_take_the_median_round_and_split_items_from_the_call() -> None:
    runs = {
        # one item: caller 3 ms and callee 2 ms a call in the median round (the other two disagree)
        ("grpc", 1): [run(0.4, 0.3), run(0.9, 0.9), run(0.3, 0.2, p50=9.0)],
        # five items: 1.2 ms more a call, so 0.3 ms a further item
        ("grpc", 5): [run(0.46, 0.36)],
        ("actor", 1): [run(1.1, 1.1)],
        ("actor", 5): [run(1.5, 1.5)],
    }
    grpc, actor = hop_cost.rows(runs, calls=100, items=5)
    assert grpc["transport"] == "grpc"
    assert grpc["caller_ms_per_call"] == pytest.approx(3.0)
    assert grpc["callee_ms_per_call"] == pytest.approx(2.0)
    assert grpc["ms_per_call"] == pytest.approx(5.0)
    assert grpc["ms_per_item"] == pytest.approx(0.3)
    assert grpc["first_item_p50_ms"] == 3.0  # the first round's
    assert actor["ms_per_call"] == pytest.approx(20.0)
    assert actor["ms_per_item"] == pytest.approx(2.0)


def test_the_section_shows_a_row_per_transport() -> None:
    rows = [{"transport": "grpc", "caller_ms_per_call": 2.28, "callee_ms_per_call": 1.77, "ms_per_call": 4.05,
             "ms_per_item": 0.36, "first_item_p50_ms": 3.46}]  # fmt: skip
    result = {**META, "kind": "hop_cost", "calls": 300, "items": 9, "rounds": 3, "rows": rows}
    page = benchmarks_page.render([result], None)
    assert "## One Ray Serve hop's CPU (300 calls a cell, 9 items in the second, median of 3 rounds)" in page
    assert "| grpc | 2.28 | 1.77 | 4.05 | 0.36 | 3.46 |" in page


def test_the_section_says_how_long_each_item_waited() -> None:
    rows = [{"transport": "grpc", "caller_ms_per_call": 1.7, "callee_ms_per_call": 1.4, "ms_per_call": 3.1,
             "ms_per_item": 0.9, "first_item_p50_ms": 16.0}]  # fmt: skip
    result = {**META, "kind": "hop_cost", "calls": 200, "items": 4, "rounds": 3, "gap_ms": 15.0, "rows": rows}
    page = benchmarks_page.render([result], None)
    title = "## One Ray Serve hop's CPU (200 calls a cell, 4 items in the second, each item 15 ms after the last,"
    assert title + " median of 3 rounds)" in page


def test_a_negative_gap_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        hop_cost.main(["--gap-ms", "-5"])
    assert "--gap-ms must not be negative" in capsys.readouterr().err
