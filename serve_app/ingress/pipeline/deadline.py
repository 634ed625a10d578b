"""Request deadlines at the ingress.

A generation request's deadline comes from its `X-Request-Timeout` header (seconds, capped at
`limits.max_request_timeout_s`) or else `limits.request_timeout_s`, counted from the request's arrival
in the ingress app (`stamp_arrival`, by its outermost middleware): early admission weighs a request
against the deadline the route then enforces, and the time a burst takes to read and parse its bodies
counts. It travels to every stage in the messages (`messages.Deadline`, wall clock), so a stage refuses
work whose deadline passed while it queued; and the ingress stops waiting at the deadline: leaving a
handle call cancels it, and Ray Serve cancels the call in the replica (the engine aborts a generation
whose generator is closed).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import Counter
from starlette.types import Scope

from serve_app.config import LimitsConfig
from serve_app.errors import BadRequestError, DeadlineExceededError, find_openai_error
from serve_app.messages import Deadline

HEADER = "X-Request-Timeout"
_ARRIVED = "serve_graph_arrived_at"  # in the ASGI scope's `state`, which Starlette's `request.state` reads


def stamp_arrival(scope: Scope) -> None:
    scope.setdefault("state", {})[_ARRIVED] = time.time()


def arrival(scope: Scope) -> float | None:
    """When the request reached the ingress app (wall clock), if stamped."""
    arrived: float | None = scope.get("state", {}).get(_ARRIVED)
    return arrived


def request_deadline(limits: LimitsConfig, header: str | None, start: float | None = None) -> Deadline | None:
    """The deadline of a request that arrived at `start` (None: now) with `header` as its X-Request-Timeout
    value (None: no header)."""
    if header is None:
        return None if limits.request_timeout_s is None else Deadline.after(limits.request_timeout_s, start)
    try:
        seconds = float(header)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadRequestError(
            f"{HEADER} must be a positive number of seconds, got {header!r}.", param=HEADER, code="invalid_header"
        )
    return Deadline.after(min(seconds, limits.max_request_timeout_s), start)


@asynccontextmanager
async def within(deadline: Deadline | None, stage: str, rejections: Counter) -> AsyncIterator[None]:
    """Waiting on `stage` inside this block ends at the deadline with DeadlineExceededError; the stage's
    own refusal of a late request is counted the same way."""
    if deadline is None:
        yield
        return
    timeout = asyncio.timeout(deadline.remaining())
    try:
        async with timeout:
            yield
    except TimeoutError as exc:
        if not timeout.expired():
            raise
        rejections.labels(stage, "deadline").inc()
        raise DeadlineExceededError(f"The request's deadline passed while waiting for the {stage} stage.") from exc
    except Exception as exc:
        if isinstance(find_openai_error(exc), DeadlineExceededError):
            rejections.labels(stage, "deadline").inc()
        raise
