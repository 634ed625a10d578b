"""The engine's socket files: each engine's in a directory of its own, removed when the engine is gone.

vLLM's ZMQ sockets between a process and its engine core are Unix socket files named in
`VLLM_RPC_BASE_PATH` (by default /tmp). vLLM binds them itself, so ZMQ does not unlink them, and vLLM
does only when its listeners are garbage-collected: never in a replica that Serve stops, nor in a
`vllm serve` stopped with Ctrl-C (2,056 such files had gathered in this machine's /tmp). Here an engine
puts them in a directory of its own, removed when it shuts down. Not sooner: the engine core may connect
after `AsyncLLM` is made, and one that found no file hung (measured: its first request waited for the
watchdog).

An engine that never shuts down (its replica killed, its node lost) cannot remove its directory; the next
engine started on the machine does, and so does `make stop` (`deployments/stop.py`). Each directory
holds a lock file, locked (`flock`) by the process that made it for as long as it runs (and by a process
forked from it, while that runs). The kernel releases the lock when they are gone, whatever killed them,
so a directory whose lock can be taken is no one's. Only the user's own directories are looked at, and a
directory without the lock file (one being made, or one made before this module) is left.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
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
    directory = _made()
    previous = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = str(directory.path)
    try:
        engine = start()
    except BaseException:
        directory.remove()
        raise
    finally:
        if previous is None:
            os.environ.pop("VLLM_RPC_BASE_PATH", None)
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = previous
    # Weakly: the engine holds this function, which must not keep the engine alive. Called once: the
    # engine's `__del__` calls it again, at the latest while the interpreter exits, when vLLM's shutdown
    # finds its module's globals gone and Python prints the TypeError.
    pending = [weakref.WeakMethod(engine.shutdown)]

    def shutdown_and_remove_files(*args: Any, **kwargs: Any) -> None:
        try:
            if pending and (method := pending.pop()()) is not None:
                method(*args, **kwargs)
        finally:
            directory.remove()

    engine.shutdown = shutdown_and_remove_files  # type: ignore[method-assign]
    return engine


def remove_orphans(parent: Path) -> list[Path]:
    """Removes this user's socket directories in `parent` whose lock no process holds; which it removed."""
    removed = []
    for path in parent.glob(f"{PREFIX}*"):
        if (orphan := _orphan(path)) is not None:
            orphan.remove()
            removed.append(path)
    return removed


class _Directory:
    """A socket directory, its lock file held open (and locked); removed once, however often asked (a
    replica's `__del__` shuts its engine down, and so does the engine's own)."""

    def __init__(self, path: Path, lock: int) -> None:
        self.path = path
        self._lock: int | None = lock

    def remove(self) -> None:
        if self._lock is None:
            return
        lock, self._lock = self._lock, None
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(lock)


def _made() -> _Directory:
    """A new socket directory, its lock file locked under another name first, then renamed: a sweep never
    sees the lock file unlocked."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        fd, name = tempfile.mkstemp(dir=path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    directory = _Directory(path, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(name, path / LOCK)
    except BaseException:
        directory.remove()
        raise
    return directory


def _orphan(path: Path) -> _Directory | None:
    """`path`, its lock taken, if it is a directory of this user's whose lock no process holds. Nothing else
    is followed or waited on: a symbolic link, another user's directory, a FIFO in the lock file's place."""
    try:
        status = path.lstat()
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            return None
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # no lock file: being made, or made before this module
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return _Directory(path, fd)
        except OSError:  # held: its engine runs
            pass
    os.close(fd)
    return None
