"""serve_app/autogroup.py: a session's weight, set from one of its processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serve_app import autogroup


def test_sets_the_nice_value_of_the_callers_own_session() -> None:
    """In a new session (so a new autogroup), as the engine core and HAProxy are; raising the nice value
    needs no privilege."""
    script = "import os; from serve_app import autogroup; os.setsid(); autogroup.set_nice(7); " \
             "print(open('/proc/self/autogroup').read().split()[-1])"  # fmt: skip
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert child.stdout == "7\n"


def test_where_the_kernel_has_no_autogroups_it_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(autogroup, "AUTOGROUP", str(tmp_path / "no-such-dir" / "autogroup"))
    with pytest.raises(OSError):
        autogroup.set_nice(-5)
