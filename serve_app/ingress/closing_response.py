"""A streaming response that runs its cleanup when the response ends, however it ends.

A body generator's own `finally` is not enough: Starlette never starts the body iterator when sending
the response's start fails (the client already gone), and leaves it suspended when the client goes
away mid-stream. What the stream holds (the engine's request, its work ticket, a speech slot) would
then wait for garbage collection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClosingStreamingResponse(StreamingResponse):
    def __init__(self, content: AsyncIterator[Any], close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.close()
