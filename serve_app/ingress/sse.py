"""Server-sent events: the OpenAI streaming wire format."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from serve_app.errors import OpenAIError, find_openai_error

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def encode(payloads: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE bytes for `payloads`; a failure after the first byte becomes an error event, then [DONE]."""
    try:
        async for payload in payloads:
            yield event(payload)
    except Exception as exc:  # the status line is gone: the error can only travel as an event
        error = find_openai_error(exc)
        if error is None:
            logger.exception("stream failed")
            error = OpenAIError(f"The stream failed: {type(exc).__name__}")
        yield event(error.to_dict())
    yield DONE
