"""Server-sent events: the OpenAI streaming wire format."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from serve_app.errors import OpenAIError, find_openai_error
from serve_app.ingress.closing_response import FinalChunk

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


class Last(dict[str, Any]):
    """A payload its stream sends last: its event goes out with [DONE] as the stream's `FinalChunk`."""


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def encode(payloads: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE bytes for `payloads`, [DONE] at the end; a failure after the first byte becomes an error event.

    The last piece is a `FinalChunk`: [DONE], after the event of a `Last` payload or of the error. Nothing
    is read after a `Last` payload.
    """
    try:
        async for payload in payloads:
            if isinstance(payload, Last):
                yield FinalChunk(event(payload) + DONE)
                return
            yield event(payload)
    except Exception as exc:  # the status line is gone: the error can only travel as an event
        error = find_openai_error(exc)
        if error is None:
            logger.exception("stream failed")
            error = OpenAIError(f"The stream failed: {type(exc).__name__}")
        yield FinalChunk(event(error.to_dict()) + DONE)
        return
    yield FinalChunk(DONE)
