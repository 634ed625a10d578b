"""Engine hang watchdog: an engine that is alive but makes no progress fails its requests and its health.

A dead engine process is noticed by vLLM itself; a hung one (stuck kernel, deadlock, a stopped
process) is not: its requests would wait forever and its health check would pass. The watchdog
counts the requests waiting on the engine for their next output; with any waiting and no output
from the engine for `timeout_s`, it declares the engine hung, cancels those waits (each fails with
`EngineDeadError`, a 503) and refuses every later request, so Serve's health check replaces the
replica. It is evaluated on every health check (Serve's and the ingress's): no task of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from serve_app.errors import EngineDeadError

T = TypeVar("T")


class EngineWatchdog:
    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        # Tasks awaiting the engine's next output; the value is what the watchdog cancelled.
        self._waiting: dict[asyncio.Task[object], bool] = {}
        self._last_progress = clock()
        self._hung: str | None = None

    def check(self) -> None:
        """Raises `EngineDeadError` if the engine is hung, declaring it so once the timeout has passed."""
        if self._hung is None and self._timeout_s is not None and self._waiting:
            stalled_s = self._clock() - self._last_progress
            if stalled_s >= self._timeout_s:
                self._declare_hung(stalled_s)
        if self._hung is not None:
            raise EngineDeadError(self._hung, code="engine_hung")

    async def next_output(self, outputs: AsyncIterator[T]) -> T | None:
        """The engine's next output for one request (None at its end), watched for progress."""
        self.check()
        task = asyncio.current_task()
        assert task is not None  # called from a coroutine
        if not self._waiting:
            # An idle engine has made no progress because it had nothing to do.
            self._last_progress = self._clock()
        self._waiting[task] = False
        try:
            output = await anext(outputs)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if self._waiting.get(task) and self._hung is not None:
                # Ours, not the caller's: it becomes the 503. Should the caller have cancelled too (its
                # client gone), the task stays cancelling and the request ends either way.
                task.uncancel()
                raise EngineDeadError(self._hung, code="engine_hung") from None
            raise
        finally:
            self._waiting.pop(task, None)
        self._last_progress = self._clock()
        return output

    def _declare_hung(self, stalled_s: float) -> None:
        self._hung = (
            f"The engine has produced no output for {stalled_s:.0f} s with {len(self._waiting)} requests "
            "waiting: it is hung; the replica will be replaced, retry shortly."
        )
        for task in self._waiting:
            self._waiting[task] = True
            task.cancel()
