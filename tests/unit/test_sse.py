"""serve_app/ingress/sse.py: the server-sent events wire format."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from serve_app.errors import BadRequestError, OverloadedError
from serve_app.ingress import sse


class Wrapper(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__("wrapped")
        self.cause = cause


async def payloads(items: list[dict[str, Any]], error: BaseException | None = None) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item
    if error is not None:
        raise error


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [part async for part in stream]


def test_event_is_one_compact_data_line() -> None:
    assert sse.event({"a": 1, "b": "x y", "c": [1, None]}) == b'data: {"a":1,"b":"x y","c":[1,null]}\n\n'
    assert sse.event({"t": "é"}) == b'data: {"t":"\\u00e9"}\n\n'
    assert sse.DONE == b"data: [DONE]\n\n"


async def test_encode_yields_events_then_done() -> None:
    parts = await collect(sse.encode(payloads([{"n": 1}, {"n": 2}])))
    assert parts == [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]


async def test_empty_stream_is_just_done() -> None:
    assert await collect(sse.encode(payloads([]))) == [b"data: [DONE]\n\n"]


async def test_openai_error_mid_stream_becomes_error_event_then_done() -> None:
    error = BadRequestError("bad stop", param="stop")
    parts = await collect(sse.encode(payloads([{"n": 1}], error)))
    assert len(parts) == 3
    assert parts[0] == b'data: {"n":1}\n\n'
    assert parts[1].startswith(b"data: ") and parts[1].endswith(b"\n\n")
    assert json.loads(parts[1][len(b"data: ") :]) == {
        "error": {"message": "bad stop", "type": "BadRequestError", "param": "stop", "code": 400}
    }
    assert parts[2] == sse.DONE


async def test_wrapped_error_is_unwrapped() -> None:
    parts = await collect(sse.encode(payloads([], Wrapper(OverloadedError("busy", code="overloaded")))))
    assert json.loads(parts[0][len(b"data: ") :]) == {
        "error": {"message": "busy", "type": "ServiceUnavailableError", "param": None, "code": "overloaded"}
    }
    assert parts[1:] == [sse.DONE]


async def test_unexpected_error_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="serve_app.ingress.sse"):
        parts = await collect(sse.encode(payloads([{"n": 1}], RuntimeError("secret detail"))))
    assert json.loads(parts[1][len(b"data: ") :]) == {
        "error": {
            "message": "The stream failed: RuntimeError",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    assert parts[2] == sse.DONE
    assert [r.getMessage() for r in caplog.records] == ["stream failed"]
    assert b"secret detail" not in b"".join(parts)
