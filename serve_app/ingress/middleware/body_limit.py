"""A bound on request body size, enforced while the body arrives (pure ASGI, before any parsing).

Image requests carry base64 data in the JSON body; without a bound, one client could make the ingress
buffer gigabytes before validation even starts. Content-Length is checked up front; chunked bodies
are counted as they stream in: going over answers 413 at once and tells the app the client left.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.errors import PayloadTooLargeError, error_response


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLargeError(
            f"The request body exceeds {self.max_bytes} bytes (limits.max_request_bytes).", code="request_too_large"
        )
        await error_response(error)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        received = 0
        rejected = False

        async def counting_receive() -> Message:
            nonlocal received, rejected
            message = await receive()
            if message["type"] == "http.request" and not rejected:
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    rejected = True
                    await self._reject(scope, receive, send)
                    # To the app the client is gone: it stops reading, and its answer is dropped below.
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not rejected:
                await send(message)

        await self.app(scope, counting_receive, guarded_send)
