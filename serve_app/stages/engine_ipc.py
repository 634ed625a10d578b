"""The engine's socket files: each engine's in a directory of its own, removed when the engine is gone.

vLLM's ZMQ sockets between a process and its engine core are Unix socket files named in
`VLLM_RPC_BASE_PATH` (by default /tmp). vLLM binds them itself, so ZMQ does not unlink them, and vLLM
does only when its listeners are garbage-collected: never in a replica that Serve stops, nor in a
`vllm serve` stopped with Ctrl-C (2,056 such files had gathered in this machine's /tmp). Here an engine
puts them in a directory of its own, removed when it shuts down. Not sooner: the engine core may connect
after `AsyncLLM` is made, and one that found no file hung (measured: its first request waited for the
watchdog).

An engine that never shuts down (its replica killed, its node lost) cannot remove its directory; the next
engine started on the machine does. Each directory holds a lock file, locked (`flock`) by the process
that made it for as long as it runs. The kernel releases the lock when that process is gone, whatever
killed it, so a directory whose lock can be taken is no one's. A directory without the lock file is one
being made, or one made before this module: left.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

PREFIX = "vllm-ipc-"
LOCK = "owner.lock"


class Stoppable(Protocol):
    def shutdown(self) -> None: ...


E = TypeVar("E", bound=Stoppable)


def socket_files_removed_at_shutdown(start: Callable[[], E]) -> E:
    """The engine `start` makes, its socket files in a directory of its own, which its `shutdown` removes;
    first, the directories of engines gone without a shutdown."""
    remove_orphans(Path(tempfile.gettempdir()))
    path = tempfile.mkdtemp(prefix=PREFIX)
    lock = _locked(Path(path))
    previous = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = path
    try:
        engine = start()
    except BaseException:
        _remove(path, lock)
        raise
    finally:
        if previous is None:
            os.environ.pop("VLLM_RPC_BASE_PATH", None)
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = previous
    # Weakly: the engine holds this function, which must not keep the engine alive.
    shutdown = weakref.WeakMethod(engine.shutdown)

    def shutdown_and_remove_files(*args: Any, **kwargs: Any) -> None:
        try:
            if (method := shutdown()) is not None:
                method(*args, **kwargs)
        finally:
            _remove(path, lock)

    engine.shutdown = shutdown_and_remove_files  # type: ignore[method-assign]
    return engine


def remove_orphans(parent: Path) -> list[Path]:
    """Removes the socket directories in `parent` whose lock no process holds; which it removed."""
    removed = []
    for directory in parent.glob(f"{PREFIX}*"):
        try:
            fd = os.open(directory / LOCK, os.O_RDONLY)
        except OSError:  # no lock file (being made, or older), or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its engine runs
            os.close(fd)
            continue
        _remove(str(directory), fd)
        removed.append(directory)
    return removed


def _locked(directory: Path) -> int:
    """The directory's lock file, open and locked. Locked under another name first, then renamed: a
    sweep never sees the lock file unlocked."""
    fd, name = tempfile.mkstemp(dir=directory)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(name, directory / LOCK)
    return fd


def _remove(path: str, lock: int) -> None:
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(lock)
