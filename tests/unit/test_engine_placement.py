"""Engine dtype and core placement (`serve_app/stages/engine_placement.py`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from serve_app.engine_config import Dtype
from serve_app.stages import engine_placement as placement
from serve_app.stages.engine_placement import BIND_ENV, bind_engine_cores, claim_cores, omp_threads, resolve_dtype


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


def started(*live: int) -> Callable[[int], float | None]:
    """Start times of the live pids (each pid's own number, as a float); None for any other."""
    return lambda pid: float(pid) if pid in live else None


def test_engines_spread_over_the_cores(tmp_path: Path) -> None:
    alive = started(101, 102, 103)
    claims = [claim_cores(1, [0, 1], registry=tmp_path, pid=p, start_time=alive) for p in (101, 102, 103)]
    # The highest core first, then the idle one, then the least held again.
    assert claims == [[1], [0], [1]]


def test_claims_of_dead_or_reused_pids_and_stray_files_are_dropped(tmp_path: Path) -> None:
    assert claim_cores(1, [0, 1], registry=tmp_path, pid=201, start_time=started(201)) == [1]
    (tmp_path / "claim-12x").write_text("0")  # not a claim this code wrote
    # 201 died: its core is free again.
    assert claim_cores(1, [0, 1], registry=tmp_path, pid=202, start_time=started(202)) == [1]
    # 202's pid now belongs to a process started later: the claim is not its.
    assert claim_cores(1, [0, 1], registry=tmp_path, pid=203, start_time=lambda p: p + 0.5) == [1]
    assert sorted(p.name for p in tmp_path.glob("claim-*")) == ["claim-203-203.5"]


def test_several_threads_claim_the_least_held_cores(tmp_path: Path) -> None:
    alive = started(1, 2)
    assert claim_cores(1, range(4), registry=tmp_path, pid=1, start_time=alive) == [3]
    assert claim_cores(2, range(4), registry=tmp_path, pid=2, start_time=alive) == [1, 2]


@pytest.mark.parametrize(("value", "threads"), [(None, 1), ("2", 2), ("4,2", 4), ("junk", 1)])
def test_omp_threads(monkeypatch: pytest.MonkeyPatch, value: str | None, threads: int) -> None:
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert omp_threads() == threads


def test_a_binding_in_the_environment_wins_over_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BIND_ENV, "0")
    assert bind_engine_cores("spread", 1) == "0"


def test_spread_falls_back_to_vllms_binding_without_a_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*args: object, **kwargs: object) -> list[int]:
        raise PermissionError("read-only temp dir")

    monkeypatch.delenv(BIND_ENV, raising=False)
    monkeypatch.setattr(placement, "claim_cores", read_only)
    assert bind_engine_cores("spread", 1) == "auto"
    assert os.environ[BIND_ENV] == "auto"


def test_bind_sets_vllms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND_ENV, raising=False)
    assert bind_engine_cores("0-1", 2) == "0-1"
    assert os.environ[BIND_ENV] == "0-1"
    assert bind_engine_cores("nobind", 1) == "nobind"
    assert os.environ[BIND_ENV] == "nobind"
