"""Stream pacing: a generation's outputs sent at most once per interval after the first.

Every chunk a stream sends costs the same CPU on its way out, whatever it carries: its part of a write
on the token channel from the llm replica to the ingress (`serve_app/token_channel.py`), a wake-up of
its request's task there, the ingress's SSE event and socket write, HAProxy's forwarding. The engine emits an output
every `engine.stream_interval` tokens however fast it decodes, so a fast engine pays that cost more often
per second than a client can read. Pacing holds an output that comes sooner than `interval_s` after the
last one sent, at most until the interval is up, and sends it merged with the ones that come meanwhile,
with vLLM's own `RequestOutput.add` (as vLLM's collector merges the outputs a slow consumer has not taken
yet). The first output and the last are never held: pacing adds nothing to the time to first token or to the
end, it changes how often a stream's text arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, Self, TypeVar


class Output(Protocol):
    """The part of vLLM's `RequestOutput` pacing uses."""

    finished: bool

    def add(self, next_output: Self, aggregate: bool) -> None: ...


OutputT = TypeVar("OutputT", bound=Output)


async def paced(
    outputs: AsyncIterator[OutputT],
    next_output: Callable[[AsyncIterator[OutputT]], Awaitable[OutputT | None]],
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[OutputT, None]:
    """`outputs`, read with `next_output` (None at their end), at most one per `interval_s` after the
    first; with `interval_s` 0, each as it comes."""
    held: OutputT | None = None
    sent_at: float | None = None  # when the last output went out
    # While an output is held, the wait for the next one is a task of its own, so that the hold can end
    # first without cancelling the read (which would abort the request in the engine).
    pending: asyncio.Future[OutputT | None] | None = None
    try:
        output = await next_output(outputs)
        while output is not None:
            if held is not None:
                held.add(output, aggregate=True)
                output, held = held, None
            now = clock()
            if sent_at is None or output.finished or now - sent_at >= interval_s:
                sent_at = now
                yield output
                output = await next_output(outputs)
                continue
            held = output
            pending = asyncio.ensure_future(next_output(outputs))
            done, _ = await asyncio.wait((pending,), timeout=sent_at + interval_s - clock())
            if done:
                output, pending = pending.result(), None
                if output is None:  # the engine ended without a last output of its own
                    output, held = held, None
                    yield output
                    return
            else:  # the interval is up with nothing new: send what is held
                output, held = held, None
                sent_at = clock()
                yield output
                output = await pending
                pending = None
    finally:
        if pending is not None:  # our caller went away while an output was held: stop reading
            pending.add_done_callback(_drop_outcome)
            pending.cancel()
            await asyncio.wait((pending,))


def _drop_outcome(read: asyncio.Future[Any]) -> None:
    """The outcome of a read whose request is gone: retrieved (so asyncio does not log it as lost), and
    dropped, even if a second cancel stops the wait for it."""
    if not read.cancelled():
        read.exception()
