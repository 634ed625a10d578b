"""Requests in progress, counted by the pure-ASGI limits (`admission.max_in_flight`,
`auth.max_concurrent_per_key`).

A request holds its count until the wrapped ASGI app returns, which for a stream is after its last
byte; a route handler would let go as soon as it returned the response object.
"""

from __future__ import annotations

from collections import Counter

from starlette.types import ASGIApp, Receive, Scope, Send


class InFlight:
    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()

    def count(self, key: int = 0) -> int:
        return self._counts[key]

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, key: int = 0) -> None:
        self._counts[key] += 1
        try:
            await app(scope, receive, send)
        finally:
            self._counts[key] -= 1
