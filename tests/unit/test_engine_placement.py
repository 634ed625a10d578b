"""Engine dtype and core placement (`serve_app/stages/engine_placement.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serve_app.config import Dtype
from serve_app.stages.engine_placement import BIND_ENV, bind_engine_cores, claim_cores, resolve_dtype


@pytest.mark.parametrize(
    ("requested", "on_gpu", "native_bf16", "expected"),
    [
        ("auto", False, False, "float32"),  # emulated bf16 is ~5x slower
        ("auto", False, True, "bfloat16"),
        ("auto", True, False, "auto"),  # vLLM's own choice on a GPU
        ("bfloat16", False, False, "bfloat16"),  # an explicit choice is kept
        ("float16", True, True, "float16"),
    ],
)
def test_resolve_dtype(requested: Dtype, on_gpu: bool, native_bf16: bool, expected: str) -> None:
    assert resolve_dtype(requested, on_gpu=on_gpu, native_bf16=native_bf16) == expected


def test_engines_spread_over_the_cores(tmp_path: Path) -> None:
    live = {101, 102, 103}
    claims = [claim_cores(1, [0, 1], registry=tmp_path, pid=p, alive=live.__contains__) for p in (101, 102, 103)]
    # The highest core first, then the idle one, then the least held again.
    assert claims == [[1], [0], [1]]


def test_claims_of_dead_engines_are_dropped(tmp_path: Path) -> None:
    live = {201}
    assert claim_cores(1, [0, 1], registry=tmp_path, pid=201, alive=live.__contains__) == [1]
    live = {202}  # 201 died: its core is free again
    assert claim_cores(1, [0, 1], registry=tmp_path, pid=202, alive=live.__contains__) == [1]
    assert sorted(p.name for p in tmp_path.glob("[0-9]*")) == ["202"]


def test_several_threads_claim_the_least_held_cores(tmp_path: Path) -> None:
    live = {1, 2}
    assert claim_cores(1, range(4), registry=tmp_path, pid=1, alive=live.__contains__) == [3]
    assert claim_cores(2, range(4), registry=tmp_path, pid=2, alive=live.__contains__) == [1, 2]


def test_bind_sets_vllms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND_ENV, raising=False)
    assert bind_engine_cores("0-1", 2) == "0-1"
    assert os.environ[BIND_ENV] == "0-1"
    assert bind_engine_cores("nobind", 1) == "nobind"
    assert os.environ[BIND_ENV] == "nobind"
