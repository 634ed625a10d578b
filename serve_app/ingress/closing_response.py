"""A streaming response that runs its cleanup when the response ends, however it ends, and ends its body
with the last chunk.

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


class FinalChunk(bytes):
    """A body's last chunk: sent as the end of the body, so that the server writes the chunk and the end of
    the chunked encoding at once. Starlette sends an empty body message after the last chunk instead: one
    more send through the ASGI layers, socket write and forward by HAProxy. No chunk may follow it."""


class ClosingStreamingResponse(StreamingResponse):
    def __init__(self, content: AsyncIterator[Any], close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.close()

    async def stream_response(self, send: Send) -> None:
        # Starlette 1.10's, but for the end of the body.
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False
        async for chunk in self.body_iterator:  # on to its end, which comes right after a final chunk
            ended = isinstance(chunk, FinalChunk)
            if not isinstance(chunk, bytes | memoryview):
                chunk = chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
