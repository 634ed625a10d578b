"""Admission at the front door: at most `admission.max_in_flight` generation requests at once per
ingress replica (pure ASGI, so a stream holds its slot until its last byte).

Serve's own bound on the ingress (`max_ongoing_requests` + `max_queued_requests`) refuses in the
proxy with a plain-text 503. This one, set below it, refuses like every other admission check (the
`admission:` status, Retry-After, an OpenAI error, counted with reason `ingress_full`), so a client
sees one kind of refusal whichever bound was reached; `/health` and `/metrics` are never refused.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.errors import OpenAIError, OverloadedError
from serve_app.ingress.middleware.in_flight import InFlight
from serve_app.ingress.middleware.paths import GENERATION_PATHS, route_path


class InFlightLimit:
    def __init__(self, app: ASGIApp, limit: int | None, render: Callable[[OpenAIError], Response]) -> None:
        self.app = app
        self.limit = limit
        self.render = render
        self.in_flight = InFlight()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.limit is None or scope["type"] != "http" or route_path(scope) not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight.count() >= self.limit:
            error = OverloadedError(
                f"The server has {self.limit} requests in progress (admission.max_in_flight); retry later.",
                code="overloaded",
                stage="ingress",
                reason="ingress_full",
            )
            await self.render(error)(scope, receive, send)
            return
        await self.in_flight.run(self.app, scope, receive, send)
