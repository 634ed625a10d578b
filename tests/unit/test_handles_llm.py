"""deployments/handles.py, `HandleLLM`: the llm stage's call and its chunks over the token channel, its
health check and metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from types import SimpleNamespace
from typing import Any, Protocol, cast

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from deployments import handles
from deployments.handles import HandleLLM
from serve_app.errors import (
    EngineDeadError,
    OverloadedError,
    PayloadTooLargeError,
    StageUnavailableError,
    mark_chunks_sent,
)
from serve_app.ingress.pipeline.clients import LLMClient
from serve_app.messages import GenerateRequest, SamplingSpec
from serve_app.token_channel import Inbox
from tests.unit.handle_fakes import (
    ChannelReplica,
    InProcessHandle,
    Pending,
    PendingHandle,
    RaisingStreamHandle,
    RecordingHandle,
)

REQUEST = GenerateRequest("r", [1], SamplingSpec(max_tokens=2))


@pytest.fixture
def inbox() -> Inbox:
    return Inbox("127.0.0.1")


async def test_a_message_over_the_transport_limit_to_the_llm_is_a_413_too(inbox: Inbox) -> None:
    lost: list[tuple[str, str]] = []
    error = AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, Metadata(), Metadata(), "Received message larger than max")
    llm = HandleLLM(RaisingStreamHandle(error), inbox, lambda stage, detail: lost.append((stage, detail)))  # type: ignore[arg-type]
    with pytest.raises(PayloadTooLargeError, match="the llm stage"):
        await anext(aiter(llm.generate(REQUEST)))
    assert lost == []


async def test_leaving_a_stream_early_cancels_it_in_the_replica(inbox: Inbox) -> None:
    response = Pending()
    llm = HandleLLM(PendingHandle(response), inbox)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await anext(aiter(llm.generate(REQUEST)))
    assert response.cancel_called
    assert llm.in_flight == 0


async def test_a_stream_in_flight_stands_for_the_llm_health_check(inbox: Inbox) -> None:
    stream = ChannelReplica()
    handle = RecordingHandle(stream)
    llm = HandleLLM(handle, inbox)  # type: ignore[arg-type]
    await llm.check_health()
    assert handle.calls == ["check_health"]  # nothing in flight: the stage is asked
    chunks = llm.generate(REQUEST)
    stream.chunks.put_nowait("chunk")
    assert cast(object, await anext(chunks)) == "chunk"  # the stand-in the stream was given
    await llm.check_health()
    assert handle.calls == ["check_health"]  # a stream in flight, stalled or not: not asked
    stream.chunks.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        await anext(chunks)
    await llm.check_health()
    assert handle.calls == ["check_health"] * 2  # nothing in flight again: asked
    assert llm.in_flight == 0


async def test_chunks_that_arrive_after_the_calls_answer_are_still_passed_on(inbox: Inbox) -> None:
    stream = ChannelReplica(last_after_answer=True)
    llm = HandleLLM(RecordingHandle(stream), inbox)  # type: ignore[arg-type]
    for chunk in ("first", "last", None):
        stream.chunks.put_nowait(chunk)
    assert [chunk async for chunk in llm.generate(REQUEST)] == ["first", "last"]  # type: ignore[comparison-overlap]


async def test_a_late_chunk_already_in_is_passed_on_however_slowly_the_stream_is_read(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handles, "LATE_CHUNKS_S", 0.01)  # shorter than the last chunk takes to come
    stream = ChannelReplica(last_after_answer=True)
    llm = HandleLLM(RecordingHandle(stream), inbox)  # type: ignore[arg-type]
    for chunk in ("first", "last", None):
        stream.chunks.put_nowait(chunk)
    chunks = llm.generate(REQUEST)
    assert cast(object, await anext(chunks)) == "first"
    await asyncio.sleep(0.2)  # a slow client: the last chunk came meanwhile
    assert cast(object, await anext(chunks)) == "last"


def dead_engine(chunks_sent: int = 0) -> EngineDeadError:
    error = EngineDeadError("The engine died: x")
    mark_chunks_sent(error, chunks_sent)  # as the llm replica's `generate_to` does
    return error


@pytest.mark.parametrize(
    ("error", "expected", "reported"),
    [
        (BackPressureError(num_queued_requests=1, max_queued_requests=1), OverloadedError, False),
        (ActorDiedError(), StageUnavailableError, True),
        (dead_engine(), EngineDeadError, True),
        # It says it sent two, and one never comes: still the error (and `/health` told), not the lost chunk's 503.
        (dead_engine(chunks_sent=2), EngineDeadError, True),
    ],
)
async def test_an_error_in_the_calls_answer_ends_the_stream_after_its_chunks(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch, error: BaseException, expected: type[Exception], reported: bool
) -> None:
    monkeypatch.setattr(handles, "LATE_CHUNKS_S", 0.05)
    lost: list[tuple[str, str]] = []
    stream = ChannelReplica(error=error)
    llm = HandleLLM(RecordingHandle(stream), inbox, lambda stage, detail: lost.append((stage, detail)))  # type: ignore[arg-type]
    for chunk in ("first", None):
        stream.chunks.put_nowait(chunk)
    chunks = llm.generate(REQUEST)
    assert cast(object, await anext(chunks)) == "first"
    with pytest.raises(expected):
        await anext(chunks)
    assert [stage for stage, _ in lost] == (["llm"] if reported else [])
    assert llm.in_flight == 0


def a_bug(chunks_sent: int) -> RuntimeError:
    error = RuntimeError("a bug")
    mark_chunks_sent(error, chunks_sent)
    return error


@pytest.mark.parametrize("error", [dead_engine(chunks_sent=2), a_bug(chunks_sent=2)])
async def test_an_error_the_stage_raised_after_chunks_comes_after_all_of_them(inbox: Inbox, error: Exception) -> None:
    """The engine died (or a bug ended the call) after two chunks, the second still on its way when the error
    answered the call."""
    stream = ChannelReplica(last_after_answer=True, error=error)
    llm = HandleLLM(RecordingHandle(stream), inbox)  # type: ignore[arg-type]
    for chunk in ("first", "second", None):
        stream.chunks.put_nowait(chunk)
    chunks = llm.generate(REQUEST)
    assert [cast(object, await anext(chunks)) for _ in range(2)] == ["first", "second"]
    with pytest.raises(type(error)):
        await anext(chunks)


async def test_an_error_whose_chunks_never_come_is_raised_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles, "LATE_CHUNKS_S", 0.01)
    error = RuntimeError("wraps what the client sees")
    error.__cause__ = cause = dead_engine()
    with pytest.raises(RuntimeError) as raised:
        await handles._late_chunk(asyncio.Queue(), 1, 1, error)
    assert raised.value is error and error.__cause__ is cause


async def test_chunks_lost_on_the_channel_are_a_503_not_a_short_answer(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handles, "LATE_CHUNKS_S", 0.05)
    stream = ChannelReplica(answer=2)  # says it sent two
    llm = HandleLLM(RecordingHandle(stream), inbox)  # type: ignore[arg-type]
    for chunk in ("first", None):
        stream.chunks.put_nowait(chunk)
    chunks = llm.generate(REQUEST)
    assert cast(object, await anext(chunks)) == "first"
    with pytest.raises(StageUnavailableError, match="sent 2 chunks and 1 arrived"):
        await anext(chunks)
    assert llm.in_flight == 0


class PendingResponse:
    """A DeploymentResponse that answers when the test says so, and records its cancellation."""

    def __init__(self) -> None:
        self.future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.cancel_called = False

    def __await__(self) -> Generator[Any, None, str]:
        return self.future.__await__()

    def cancel(self) -> None:
        self.cancel_called = True


async def test_a_metrics_scrape_does_not_wait_for_a_slot_of_a_full_llm_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handles, "METRICS_WAIT_S", 0.01)
    responses = [PendingResponse()]
    handle: SimpleNamespace = SimpleNamespace(
        options=lambda **_: handle, metrics_text=SimpleNamespace(remote=lambda: responses[-1])
    )
    llm = HandleLLM(handle, Inbox("127.0.0.1"))  # type: ignore[arg-type]
    assert await llm.metrics_text() == "# llm stage at capacity: no metrics from it yet\n"
    responses.append(PendingResponse())
    responses[1].future.set_result("vllm:num_requests_running 2.0\n")
    assert await llm.metrics_text() == "vllm:num_requests_running 2.0\n"
    responses.append(PendingResponse())  # every slot taken: the call would wait for a generation to end
    text = await llm.metrics_text()
    assert text.startswith("# llm stage at capacity: its metrics as of ")
    assert text.endswith(" s ago\nvllm:num_requests_running 2.0\n")
    assert responses[0].cancel_called and responses[2].cancel_called  # the places they took are given back


class ExtendedLLMClient(LLMClient, Protocol):
    async def num_unfinished_requests(self) -> int: ...


async def test_a_unary_method_added_to_the_llm_client_is_a_call_to_the_deployment_method_of_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Replica:
        async def num_unfinished_requests(self) -> int:
            return 3

    llm = HandleLLM(InProcessHandle(Replica()), Inbox("127.0.0.1"))  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="not a method of LLMClient"):
        await llm.num_unfinished_requests()
    monkeypatch.setattr(handles._UnaryLLM, "client", ExtendedLLMClient)
    assert await llm.num_unfinished_requests() == 3
