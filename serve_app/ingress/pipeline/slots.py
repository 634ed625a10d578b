"""A bounded number of holders with a bounded wait for a free slot (speech streams: `tts.max_streams`
speaking, `tts.max_waiting_streams` waiting).

Waiting is what vLLM's waiting queue and Serve's `max_queued_requests` give the other requests: a
short burst is served a little later instead of refused. The wait is bounded in length (beyond it a
caller is refused at once, to retry elsewhere) and in time (by the caller's deadline; a caller that
goes away leaves the queue). Slots are granted in arrival order.
"""

from __future__ import annotations

import asyncio


class Slots:
    def __init__(self, limit: int, max_waiting: int) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self.held = 0
        self.waiting = 0
        self._free = asyncio.Semaphore(limit)

    async def acquire(self) -> bool:
        """Wait for a slot; False, at once, when every slot is held and `max_waiting` callers already wait."""
        if self.held >= self.limit and self.waiting >= self.max_waiting:
            return False
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.held += 1
        return True

    def release(self) -> None:
        self.held -= 1
        self._free.release()
