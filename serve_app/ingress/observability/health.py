"""Graph health as the ingress sees it, kept current in the background.

A probe of `/health` reads the last result instead of calling every stage, so probes cost nothing
downstream and stay fast under load, while a dead engine still turns `/health` red within one poll
interval (or at once, when a request sees a stage's replica or the engine die).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

Check = Callable[[], Awaitable[None]]


@dataclass
class StageHealth:
    ok: bool
    detail: str
    # When the check started (or the failure was seen): a poll that began before a request saw the
    # stage die must not paint it green again.
    checked_at: float


class HealthMonitor:
    def __init__(self, checks: Mapping[str, Check], interval_s: float, timeout_s: float) -> None:
        self._checks = checks
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._status: dict[str, StageHealth] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="health-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def poll_once(self) -> None:
        names = list(self._checks)
        results = await asyncio.gather(*(self._check(n) for n in names))
        for name, result in zip(names, results, strict=True):
            previous = self._status.get(name)
            if previous is None or result.checked_at >= previous.checked_at:
                self._status[name] = result

    def mark_failed(self, stage: str, detail: str) -> None:
        self._status[stage] = StageHealth(False, detail, time.monotonic())

    def report(self) -> tuple[bool, dict[str, str]]:
        details = {}
        for name in self._checks:
            state = self._status.get(name)
            details[name] = "starting" if state is None else ("ok" if state.ok else state.detail)
        return all(v == "ok" for v in details.values()), details

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self._interval_s)

    async def _check(self, name: str) -> StageHealth:
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._checks[name](), self._timeout_s)
        except TimeoutError:
            return StageHealth(False, f"no answer within {self._timeout_s} s", started)
        except Exception as exc:  # any failure of a stage's check is that stage being unhealthy
            return StageHealth(False, f"{type(exc).__name__}: {exc}"[:300], started)
        return StageHealth(True, "ok", started)
