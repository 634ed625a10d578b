"""InFlight: a request's count is held until the wrapped ASGI app returns, and given back when it fails."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Receive, Scope, Send

from serve_app.ingress.middleware.in_flight import InFlight

SCOPE: Scope = {"type": "http"}


async def _receive() -> dict[str, object]:
    return {"type": "http.disconnect"}


async def _send(_: object) -> None:
    return None


async def test_a_request_is_counted_until_the_app_returns() -> None:
    in_flight, release = InFlight(), asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await release.wait()

    task = asyncio.create_task(in_flight.run(app, SCOPE, _receive, _send, key=3))
    await asyncio.sleep(0)
    assert (in_flight.count(3), in_flight.count()) == (1, 0)
    release.set()
    await task
    assert in_flight.count(3) == 0


async def test_a_failing_app_gives_its_count_back() -> None:
    in_flight = InFlight()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await in_flight.run(app, SCOPE, _receive, _send)
    assert in_flight.count() == 0
