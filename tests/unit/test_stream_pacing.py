"""serve_app/stages/stream_pacing.py with vLLM's own `RequestOutput` (its `add` does the merging).

The clock that decides whether an output is held is a fake one; only the end of a hold waits in real
time (the interval), so nothing here depends on how fast the machine runs the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
from vllm.outputs import RequestOutput

from serve_app.stages.stream_pacing import paced
from tests.unit.conftest import Clock
from tests.unit.vllm_support import output


class Engine:
    """Outputs put by the test, one read at a time; None ends them. Records how its reading ended."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RequestOutput | None] = asyncio.Queue()
        self.exit: str | None = None

    async def outputs(self) -> AsyncGenerator[RequestOutput, None]:
        try:
            while (item := await self.queue.get()) is not None:
                yield item
        except asyncio.CancelledError:
            self.exit = "cancelled"  # vLLM's AsyncLLM.generate aborts the request here
            raise
        self.exit = "finished"

    def put(self, *items: RequestOutput | None) -> None:
        for item in items:
            self.queue.put_nowait(item)


async def next_output(outputs: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    return await anext(outputs, None)


def texts(out: RequestOutput) -> list[tuple[int, str, list[int]]]:
    return [(c.index, c.text, list(c.token_ids)) for c in out.outputs]


async def test_without_an_interval_every_output_goes_out_as_it_comes() -> None:
    engine, clock = Engine(), Clock(100.0)
    engine.put(output((0, "a", [1])), output((0, "b", [2])), output((0, "c", [3]), finished=True), None)
    sent = [texts(o) async for o in paced(engine.outputs(), next_output, 0.0, clock)]
    assert sent == [[(0, "a", [1])], [(0, "b", [2])], [(0, "c", [3])]]
    assert engine.exit == "finished"


async def test_outputs_within_the_interval_go_out_merged_with_the_last_never_held() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 1000.0, clock)  # a hold that never ends by itself
    engine.put(output((0, "He", [1])))
    first = await anext(stream)
    assert texts(first) == [(0, "He", [1])]  # the first output is never held
    engine.put(output((0, "ll", [2])), output((0, "o", [3])), output((0, "!", [4]), finished=True), None)
    last = await asyncio.wait_for(anext(stream), 5)
    assert texts(last) == [(0, "llo!", [2, 3, 4])] and last.finished
    assert await anext(stream, None) is None
    assert engine.exit == "finished"


async def test_a_finished_output_goes_out_at_once_with_what_is_held() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 1000.0, clock)
    engine.put(output((0, "a", [1])))
    await anext(stream)
    engine.put(output((0, "b", [2])), output((0, "c", [3]), finished=True))  # and the engine stays open
    last = await asyncio.wait_for(anext(stream), 5)
    assert texts(last) == [(0, "bc", [2, 3])] and last.finished
    await stream.aclose()


async def test_the_hold_counts_from_the_last_output_sent_not_the_last_received() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 0.5, clock)
    engine.put(output((0, "a", [1])))
    await anext(stream)  # sent at 100.0
    receiving = asyncio.create_task(anext(stream))
    for at, item in ((100.2, output((0, "b", [2]))), (100.4, output((0, "c", [3]))), (100.6, output((0, "d", [4])))):
        clock.now = at
        engine.put(item)
        await asyncio.sleep(0.01)
    # "d" came 0.6 s after the last output sent: it goes out at once, with the two held before it (a hold
    # that restarted at each output would still be waiting, until its timer 0.3 s of real time later).
    assert texts(await asyncio.wait_for(receiving, 0.25)) == [(0, "bcd", [2, 3, 4])]
    await stream.aclose()


async def test_choices_merge_by_index() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 1000.0, clock)
    engine.put(output((0, "a", [1]), (1, "x", [7])))
    await anext(stream)
    engine.put(output((1, "y", [8])), output((0, "b", [2]), (1, "z", [9]), finished=True), None)
    last = await asyncio.wait_for(anext(stream), 5)
    # Choices in the order each index first came: the ingress goes by the index.
    assert sorted(texts(last)) == [(0, "b", [2]), (1, "yz", [8, 9])]


async def test_a_held_output_goes_out_when_the_interval_is_up() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 0.05, clock)
    engine.put(output((0, "a", [1])), output((0, "b", [2])))
    await anext(stream)
    # Nothing else comes: "b" is held only until the interval (50 ms of real time) is up.
    assert texts(await asyncio.wait_for(anext(stream), 5)) == [(0, "b", [2])]
    clock.now += 0.01  # the next comes sooner than the interval after "b": held again, then merged with the last
    engine.put(output((0, "c", [3])), output((0, "d", [4]), finished=True), None)
    assert texts(await asyncio.wait_for(anext(stream), 5)) == [(0, "cd", [3, 4])]
    assert await anext(stream, None) is None


async def test_an_output_after_the_interval_goes_out_at_once() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 0.5, clock)
    engine.put(output((0, "a", [1])))
    await anext(stream)
    clock.now += 0.5
    engine.put(output((0, "b", [2])))
    assert texts(await asyncio.wait_for(anext(stream), 0.4)) == [(0, "b", [2])]  # sooner than a hold
    await stream.aclose()


async def test_what_is_held_goes_out_when_the_outputs_end_without_a_finished_one() -> None:
    engine, clock = Engine(), Clock(100.0)
    engine.put(output((0, "a", [1])), output((0, "b", [2])), output((0, "c", [3])), None)
    sent = [texts(o) async for o in paced(engine.outputs(), next_output, 1000.0, clock)]
    assert sent == [[(0, "a", [1])], [(0, "bc", [2, 3])]]


async def test_closing_while_an_output_is_held_stops_reading_the_engine() -> None:
    engine, clock = Engine(), Clock(100.0)
    stream = paced(engine.outputs(), next_output, 1000.0, clock)
    engine.put(output((0, "a", [1])))
    await anext(stream)
    engine.put(output((0, "b", [2])))
    receiving = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.05)  # "b" is held; the read of the next output waits on the engine
    receiving.cancel()  # the client went away: Serve cancels the call
    with pytest.raises(asyncio.CancelledError):
        await receiving
    await stream.aclose()
    assert engine.exit == "cancelled"


async def test_an_engine_error_while_holding_reaches_the_caller() -> None:
    async def failing() -> AsyncGenerator[RequestOutput, None]:
        yield output((0, "a", [1]))
        yield output((0, "b", [2]))
        raise RuntimeError("engine died")

    stream = paced(failing(), next_output, 1000.0, Clock(100.0))
    await anext(stream)
    with pytest.raises(RuntimeError, match="engine died"):
        await anext(stream)
