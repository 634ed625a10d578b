"""Stream plumbing of the endpoints: several generations merged as they arrive, and one choice
accumulated over a whole generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from serve_app.messages import ChoiceDelta, GenerationChunk, TokenLogprob


async def merge(
    streams: list[AsyncIterator[GenerationChunk]],
) -> AsyncGenerator[tuple[int, GenerationChunk], None]:
    """Chunks of several streams as they arrive, tagged with the stream's position."""
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield 0, chunk
        return
    queue: asyncio.Queue[tuple[int, GenerationChunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[GenerationChunk]) -> None:
        try:
            async for chunk in stream:
                await queue.put((i, chunk))
        except Exception as exc:  # handed to the consumer below, which re-raises it
            await queue.put((i, exc))
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class ChoiceState:
    """One choice accumulated over a whole generation (non-streaming responses, usage)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def add(self, delta: ChoiceDelta) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason
