"""serve_app/stages/engine_watchdog.py: a hung engine fails its requests and its health, through LLMStage."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.errors import EngineDeadError
from serve_app.messages import GenerationChunk
from serve_app.stages.engine_watchdog import EngineWatchdog
from serve_app.stages.llm import LLMStage
from tests.unit.conftest import Clock
from tests.unit.vllm_support import FakeEngine, completion, output, request, request_output, stream_of

TIMEOUT_S = 10.0


@pytest.fixture()
def clock() -> Clock:
    return Clock(1000.0)


def hanging_engine() -> FakeEngine:
    """Yields one output, then waits forever, as an engine whose process is stopped."""
    engine = FakeEngine([output((0, "a", [1]))])
    engine.wait = asyncio.Event()
    return engine


def stage_with(engine: FakeEngine, clock: Clock, timeout_s: float | None = TIMEOUT_S) -> LLMStage:
    return LLMStage(engine, watchdog=EngineWatchdog(timeout_s, clock))


async def consume(stage: LLMStage) -> list[GenerationChunk]:
    return [chunk async for chunk in stage.generate(request())]


async def test_a_stalled_engine_is_declared_hung_and_fails_its_requests(clock: Clock) -> None:
    engine = hanging_engine()
    stage = stage_with(engine, clock)
    consumer = asyncio.create_task(consume(stage))
    await asyncio.wait_for(engine.waiting.wait(), 5)
    clock.now += TIMEOUT_S - 1
    await stage.check_health()  # slow is not hung
    clock.now += 1
    with pytest.raises(EngineDeadError) as raised:
        await stage.check_health()
    assert raised.value.code == "engine_hung"
    assert raised.value.status_code == 503
    assert "no output for 10 s with 1 requests waiting" in raised.value.message
    with pytest.raises(EngineDeadError, match="hung"):
        await asyncio.wait_for(consumer, 5)
    assert engine.exit == "cancelled"  # the wait on the engine was cancelled: vLLM aborts the request
    assert not consumer.cancelled()


async def test_a_hang_while_an_output_is_held_for_pacing_fails_the_request(clock: Clock) -> None:
    engine = FakeEngine([output((0, "a", [1])), output((0, "b", [2]))])
    engine.wait = asyncio.Event()
    stage = LLMStage(engine, watchdog=EngineWatchdog(TIMEOUT_S, clock), stream_interval_s=1000.0)
    received: list[GenerationChunk] = []

    async def receive() -> None:
        async for chunk in stage.generate(request()):
            received.append(chunk)

    consumer = asyncio.create_task(receive())
    await asyncio.wait_for(engine.waiting.wait(), 5)  # "b" is held; pacing's own task waits on the engine
    clock.now += TIMEOUT_S
    with pytest.raises(EngineDeadError):
        await stage.check_health()
    with pytest.raises(EngineDeadError, match="hung"):
        await asyncio.wait_for(consumer, 5)
    assert [chunk.deltas[0].text for chunk in received] == ["a"]
    assert engine.exit == "cancelled"


async def test_once_hung_new_requests_and_health_checks_are_refused(clock: Clock) -> None:
    engine = hanging_engine()
    stage = stage_with(engine, clock)
    consumer = asyncio.create_task(consume(stage))
    await asyncio.wait_for(engine.waiting.wait(), 5)
    clock.now += TIMEOUT_S
    with pytest.raises(EngineDeadError):
        await stage.check_health()
    await asyncio.gather(consumer, return_exceptions=True)
    calls = len(engine.calls)
    with pytest.raises(EngineDeadError, match="hung"):
        await consume(stage)
    assert len(engine.calls) == calls  # refused before it reached the engine
    clock.now += 3600
    with pytest.raises(EngineDeadError):
        await stage.check_health()


async def test_an_idle_engine_is_never_hung(clock: Clock) -> None:
    engine = FakeEngine([output((0, "a", [1])), request_output(completion(0, "b", [2], "stop"), finished=True)])
    stage = stage_with(engine, clock)
    clock.now += 10 * TIMEOUT_S
    await stage.check_health()
    assert len(await consume(stage)) == 2  # idle time before a request does not count against it
    clock.now += 10 * TIMEOUT_S
    await stage.check_health()


async def test_progress_resets_the_timer(clock: Clock) -> None:
    engine = FakeEngine([output((0, "a", [1])), output((0, "b", [2]))])
    engine.wait = asyncio.Event()
    stage = stage_with(engine, clock)
    stream = stream_of(stage, request())
    clock.now += TIMEOUT_S - 1
    await anext(stream)
    clock.now += TIMEOUT_S - 1
    await anext(stream)  # an output just before the timeout: still alive
    waiting = asyncio.create_task(anext(stream))
    await asyncio.wait_for(engine.waiting.wait(), 5)
    clock.now += TIMEOUT_S - 1
    await stage.check_health()
    engine.wait.set()
    with pytest.raises(StopAsyncIteration):
        await waiting


async def test_a_request_held_by_its_slow_consumer_is_not_waiting_on_the_engine(clock: Clock) -> None:
    engine = FakeEngine([output((0, "a", [1])), request_output(completion(0, "b", [2], "stop"), finished=True)])
    stage = stage_with(engine, clock)
    stream = stage.generate(request())
    await anext(stream)  # then the client stops reading
    clock.now += 10 * TIMEOUT_S
    await stage.check_health()
    assert (await anext(stream)).finished


async def test_watchdog_off(clock: Clock) -> None:
    engine = hanging_engine()
    stage = stage_with(engine, clock, timeout_s=None)
    consumer = asyncio.create_task(consume(stage))
    await asyncio.wait_for(engine.waiting.wait(), 5)
    clock.now += 1e6
    await stage.check_health()
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)


async def test_a_cancelled_caller_stays_cancelled(clock: Clock) -> None:
    engine = hanging_engine()
    stage = stage_with(engine, clock)
    consumer = asyncio.create_task(consume(stage))
    await asyncio.wait_for(engine.waiting.wait(), 5)
    consumer.cancel()  # a client disconnect, not the watchdog
    await asyncio.gather(consumer, return_exceptions=True)
    assert consumer.cancelled()
    clock.now += 10 * TIMEOUT_S
    await stage.check_health()  # nothing is waiting any more
