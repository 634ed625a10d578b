"""What every result file carries and how it is written (load/meta.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load.meta import run_meta, save_result


def test_run_meta_names_the_command_date_and_machine() -> None:
    meta = run_meta("load.burst", ["--requests", "400"])
    assert meta["command"] == "python -m load.burst --requests 400"
    assert set(meta) == {"command", "date", "machine"}


def test_a_result_is_written_as_json_into_a_directory_made_for_it(tmp_path: Path) -> None:
    out = tmp_path / "new" / "result.json"
    save_result(out, {"kind": "burst", "rows": [1, 2]})
    assert json.loads(out.read_text()) == {"kind": "burst", "rows": [1, 2]}
    assert out.read_text().endswith("\n")


def test_no_path_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a file named after `None` would land
    save_result(None, {"kind": "burst"})
    assert list(tmp_path.iterdir()) == []
