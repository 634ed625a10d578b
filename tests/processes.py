"""Process helpers shared by the unit and integration tests."""

from __future__ import annotations

from pathlib import Path

import psutil


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def autogroup(pid: int) -> str:
    """`/autogroup-<id> nice <n>`: the scheduling group of `pid` and its weight."""
    return Path(f"/proc/{pid}/autogroup").read_text().strip()
