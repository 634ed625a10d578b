"""serve_app/ingress/sse.py: the server-sent events wire format."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from serve_app.errors import BadRequestError, OverloadedError
from serve_app.ingress import sse
from serve_app.ingress.closing_response import FinalChunk


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


async def test_encode_yields_events_then_done_as_the_final_chunk() -> None:
    parts = await collect(sse.encode(payloads([{"n": 1}, {"n": 2}])))
    assert parts == [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    assert [type(part) for part in parts] == [bytes, bytes, FinalChunk]


async def test_a_last_payload_goes_out_with_done_and_nothing_after_it_is_read() -> None:
    read: list[int] = []

    async def counted() -> AsyncIterator[dict[str, Any]]:
        for n in range(3):
            read.append(n)
            yield sse.Last({"n": n}) if n == 1 else {"n": n}

    parts = await collect(sse.encode(counted()))
    assert parts == [b'data: {"n":0}\n\n', b'data: {"n":1}\n\ndata: [DONE]\n\n']
    assert isinstance(parts[-1], FinalChunk)
    assert read == [0, 1]


async def test_empty_stream_is_just_done() -> None:
    parts = await collect(sse.encode(payloads([])))
    assert parts == [b"data: [DONE]\n\n"] and isinstance(parts[0], FinalChunk)


def error_of(final: bytes) -> Any:
    """The error event's payload in a final chunk: the error event, then [DONE]."""
    assert isinstance(final, FinalChunk) and final.startswith(b"data: ") and final.endswith(b"\n\n" + sse.DONE)
    return json.loads(final[len(b"data: ") : -len(b"\n\n" + sse.DONE)])


async def test_openai_error_mid_stream_becomes_error_event_then_done() -> None:
    error = BadRequestError("bad stop", param="stop")
    parts = await collect(sse.encode(payloads([{"n": 1}], error)))
    assert len(parts) == 2
    assert parts[0] == b'data: {"n":1}\n\n'
    assert error_of(parts[1]) == {
        "error": {"message": "bad stop", "type": "BadRequestError", "param": "stop", "code": 400}
    }


async def test_wrapped_error_is_unwrapped() -> None:
    parts = await collect(sse.encode(payloads([], Wrapper(OverloadedError("busy", code="overloaded")))))
    assert len(parts) == 1
    assert error_of(parts[0]) == {
        "error": {"message": "busy", "type": "ServiceUnavailableError", "param": None, "code": "overloaded"}
    }


async def test_unexpected_error_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="serve_app.ingress.sse"):
        parts = await collect(sse.encode(payloads([{"n": 1}], RuntimeError("secret detail"))))
    assert len(parts) == 2
    assert error_of(parts[1]) == {
        "error": {
            "message": "The stream failed: RuntimeError",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    assert [r.getMessage() for r in caplog.records] == ["stream failed"]
    assert b"secret detail" not in b"".join(parts)
