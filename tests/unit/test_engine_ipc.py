"""serve_app/stages/engine_ipc.py: each engine's socket directory, and those of engines gone without a shutdown."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.stages.engine_ipc import LOCK, PREFIX, remove_orphans, socket_files_removed_at_shutdown

ROOT = Path(__file__).parents[2]

# An engine's process: prints its socket directory, then runs until it is killed.
OWNER = """
import os, sys, tempfile, time
tempfile.tempdir = sys.argv[1]
from serve_app.stages.engine_ipc import socket_files_removed_at_shutdown

class Engine:
    def __init__(self):
        print(os.environ["VLLM_RPC_BASE_PATH"], flush=True)

    def shutdown(self):
        pass

engine = socket_files_removed_at_shutdown(Engine)
time.sleep(120)
"""


class Engine:
    """An engine as vLLM's `AsyncLLM` is made: in the directory `VLLM_RPC_BASE_PATH` names then."""

    def __init__(self) -> None:
        self.path = Path(os.environ["VLLM_RPC_BASE_PATH"])
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture
def owner(temp: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", OWNER, str(temp)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    yield process
    process.kill()
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


def test_an_engines_directory_is_its_own_and_goes_at_its_shutdown(temp: Path) -> None:
    engine = socket_files_removed_at_shutdown(Engine)
    assert engine.path.parent == temp and engine.path.name.startswith(PREFIX)
    assert remove_orphans(temp) == []  # its engine runs
    engine.shutdown()
    assert engine.shutdowns == 1 and list(temp.iterdir()) == []


def test_a_second_shutdown_closes_nothing_more(temp: Path) -> None:
    engine = socket_files_removed_at_shutdown(Engine)
    engine.shutdown()  # the replica's, in its `__del__`
    other = os.open(temp / "other", os.O_CREAT | os.O_RDONLY)  # likely the lock's file descriptor number again
    try:
        engine.shutdown()  # vLLM's own, in the engine's `__del__`
        os.fstat(other)  # still open
    finally:
        os.close(other)
    assert engine.shutdowns == 1  # vLLM's shutdown is not run again (at exit it would fail on its globals)


def test_a_sweep_follows_no_link_and_waits_on_no_fifo(temp: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / LOCK).touch()  # a lock no process holds, behind a link
    (temp / f"{PREFIX}link").symlink_to(elsewhere)
    (fifo := temp / f"{PREFIX}fifo").mkdir()
    os.mkfifo(fifo / LOCK)  # which anyone could put in a shared /tmp: opening it would wait for a writer
    swept: list[list[Path]] = []
    sweep = threading.Thread(target=lambda: swept.append(remove_orphans(temp)), daemon=True)
    sweep.start()
    sweep.join(10)
    assert swept == [[]]
    assert (elsewhere / LOCK).exists() and (fifo / LOCK).exists()


def test_an_engine_that_fails_to_start_leaves_no_directory(temp: Path) -> None:
    def start() -> Engine:
        raise RuntimeError("no engine")

    with pytest.raises(RuntimeError, match="no engine"):
        socket_files_removed_at_shutdown(start)
    assert list(temp.iterdir()) == []


def test_the_directory_of_an_engine_killed_without_shutdown_goes_at_the_next_start(
    temp: Path, owner: subprocess.Popen[str]
) -> None:
    assert owner.stdout is not None
    killed = Path(owner.stdout.readline().strip())
    assert killed.parent == temp
    older = temp / f"{PREFIX}older"  # made before the lock files: left
    older.mkdir()
    assert remove_orphans(temp) == [] and killed.exists()  # its process runs
    owner.kill()
    owner.wait()
    engine = socket_files_removed_at_shutdown(Engine)
    assert not killed.exists()
    assert sorted(temp.iterdir()) == sorted([older, engine.path])
    engine.shutdown()
