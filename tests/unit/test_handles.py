"""deployments/handles.py: a stage replica lost mid-call becomes a 503 naming the stage, and is reported."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from types import SimpleNamespace
from typing import Any, Protocol, cast

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from deployments import handles
from deployments.handles import HandleLLM, HandleTokenizer, HandleVocoder
from deployments.tokenizer import Tokenizer
from serve_app.config import AppArgs
from serve_app.errors import EngineDeadError, OverloadedError, PayloadTooLargeError, StageUnavailableError
from serve_app.ingress.pipeline.clients import LLMClient
from serve_app.messages import GenerateRequest, ReplyTo, SamplingSpec, TextPrompt, TokenizeRequest, VocodeRequest
from serve_app.token_channel import Inbox, Outbox
from tests.unit.conftest import deployment_class

REQUEST = GenerateRequest("r", [1], SamplingSpec(max_tokens=2))


@pytest.fixture
def inbox() -> Inbox:
    return Inbox("127.0.0.1")


class FailingHandle:
    """A DeploymentHandle whose every method call raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, method: str) -> Any:
        return self

    async def _raise(self) -> None:
        raise self.error

    def remote(self, *args: Any) -> Any:
        return self._raise()


LOST = [
    ActorDiedError(),
    ActorUnavailableError("Actor is unavailable.", None),
    AioRpcError(grpc.StatusCode.UNAVAILABLE, Metadata(), Metadata(), "Socket closed"),
]


async def test_a_message_over_the_transport_limit_is_a_413_and_leaves_health_alone() -> None:
    lost: list[tuple[str, str]] = []
    error = AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, Metadata(), Metadata(), "Received message larger than max")
    tokenizer = HandleTokenizer(FailingHandle(error), lambda stage, detail: lost.append((stage, detail)))  # type: ignore[arg-type]
    with pytest.raises(PayloadTooLargeError) as raised:
        await tokenizer.tokenize(TokenizeRequest(TextPrompt("hi"), add_special_tokens=True))
    assert (raised.value.status_code, raised.value.code) == (413, "request_too_large")
    assert "tokenizer" in raised.value.message and lost == []


class RaisingStreamHandle:
    """A DeploymentHandle (also as its `options()`) whose every call raises `error` at once."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def options(self, **_: Any) -> RaisingStreamHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        return self

    def remote(self, *args: Any) -> Any:
        raise self.error


async def test_a_message_over_the_transport_limit_to_the_llm_is_a_413_too(inbox: Inbox) -> None:
    lost: list[tuple[str, str]] = []
    error = AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, Metadata(), Metadata(), "Received message larger than max")
    llm = HandleLLM(RaisingStreamHandle(error), inbox, lambda stage, detail: lost.append((stage, detail)))  # type: ignore[arg-type]
    with pytest.raises(PayloadTooLargeError, match="the llm stage"):
        await anext(aiter(llm.generate(REQUEST)))
    assert lost == []


@pytest.mark.parametrize("error", LOST)
async def test_a_lost_replica_is_a_503_naming_the_stage_and_is_reported(error: BaseException) -> None:
    lost: list[tuple[str, str]] = []
    tokenizer = HandleTokenizer(FailingHandle(error), lambda stage, detail: lost.append((stage, detail)))  # type: ignore[arg-type]
    with pytest.raises(StageUnavailableError) as raised:
        await tokenizer.tokenize(TokenizeRequest(TextPrompt("hi"), add_special_tokens=True))
    assert raised.value.status_code == 503
    assert raised.value.code == "stage_unavailable"
    assert "The tokenizer stage failed during the request" in raised.value.message
    assert raised.value.__cause__ is error
    assert lost == [("tokenizer", f"replica lost mid-call: {type(error).__name__}")]


async def test_a_full_stage_is_alive_not_lost() -> None:
    lost: list[tuple[str, str]] = []
    vocoder = HandleVocoder(FailingHandle(BackPressureError(num_queued_requests=1, max_queued_requests=1)),  # type: ignore[arg-type]
                            lambda stage, detail: lost.append((stage, detail)))  # fmt: skip
    await vocoder.check_health()  # its queues are full: its replicas are up and working
    with pytest.raises(OverloadedError):  # a request is refused, though
        await vocoder.decode(VocodeRequest([[0] * 7], 0, None))
    assert lost == []


async def test_other_errors_pass_through() -> None:
    tokenizer = HandleTokenizer(FailingHandle(KeyError("x")))  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        await tokenizer.detokenize([1])


class Pending:
    """A Serve response that never completes; records whether it was cancelled (in `cancel_called`, as
    the fakes below: Serve's streaming response has a `cancelled()` method of its own)."""

    def __init__(self) -> None:
        self.cancel_called = False

    def __await__(self) -> Any:
        return asyncio.sleep(3600).__await__()

    def cancel(self) -> None:
        self.cancel_called = True


class PendingHandle:
    def __init__(self, response: Any) -> None:
        self.response = response

    def __getattr__(self, method: str) -> Any:
        return self

    def options(self, **_: Any) -> PendingHandle:
        return self

    def remote(self, *args: Any) -> Any:
        return self.response


async def test_leaving_a_unary_call_early_cancels_it_in_the_replica() -> None:
    response = Pending()
    tokenizer = HandleTokenizer(PendingHandle(response))  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # as the request's deadline does
            await tokenizer.tokenize(TokenizeRequest(TextPrompt("hi"), add_special_tokens=True))
    assert response.cancel_called


async def test_leaving_a_stream_early_cancels_it_in_the_replica(inbox: Inbox) -> None:
    response = Pending()
    llm = HandleLLM(PendingHandle(response), inbox)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await anext(aiter(llm.generate(REQUEST)))
    assert response.cancel_called
    assert llm.in_flight == 0


class InProcessHandle:
    """A DeploymentHandle whose calls run the deployment's class in this process."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica

    def __getattr__(self, method: str) -> Any:
        return InProcessMethod(getattr(self.replica, method))

    def options(self, **_: Any) -> InProcessHandle:
        return self


class InProcessMethod:
    def __init__(self, method: Any) -> None:
        self.method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.method(*args, **kwargs)  # a coroutine: awaitable as a Serve response is


async def test_each_handle_method_calls_the_deployment_method_of_its_name(app_args: AppArgs) -> None:
    replica = deployment_class(Tokenizer)(app_args)
    tokenizer = HandleTokenizer(InProcessHandle(replica))  # type: ignore[arg-type]
    request = TokenizeRequest(TextPrompt("hello there"), add_special_tokens=True)
    tokenized = await tokenizer.tokenize(request)
    assert tokenized.token_ids == (await replica.tokenize(request)).token_ids
    assert await tokenizer.detokenize(tokenized.token_ids) == await replica.detokenize(tokenized.token_ids)
    assert await tokenizer.speech_layout() is None  # a text model
    await tokenizer.check_health()


class ChannelReplica:
    """An llm replica's `generate_to`: sends what the test puts in `chunks` over the token channel, until
    None; then answers how many it sent, or `answer` if set. With `last_after_answer`, the last chunk
    leaves after the answer."""

    def __init__(
        self, answer: int | None = None, last_after_answer: bool = False, error: BaseException | None = None
    ) -> None:
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.outbox = Outbox()
        self.answer = answer
        self.last_after_answer = last_after_answer
        self.error = error

    async def generate_to(self, request: GenerateRequest, reply_to: ReplyTo) -> int:
        connection = await self.outbox.connection(reply_to)
        sent, held = 0, None
        while (chunk := await self.chunks.get()) is not None:
            sent += 1
            if held is not None:
                connection.send(reply_to.key, held)
            held = chunk
            if not self.last_after_answer:
                connection.send(reply_to.key, held)
                held = None
        if held is not None:
            asyncio.get_running_loop().call_later(0.05, connection.send, reply_to.key, held)
        if self.error is not None:
            await asyncio.sleep(0.05)  # the chunks before it are in by then
            raise self.error
        return sent if self.answer is None else self.answer


class RecordingHandle:
    """`generate` streams from `stream`; `tokenize` answers when the test resolves its future in `pending`;
    any other method is recorded in `calls` and answers None."""

    def __init__(self, stream: ChannelReplica | None = None) -> None:
        self.stream = stream
        self.pending: list[asyncio.Future[Any]] = []
        self.calls: list[str] = []

    def options(self, **_: Any) -> RecordingHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        return RecordedMethod(self, method)


class RecordedMethod:
    def __init__(self, handle: RecordingHandle, method: str) -> None:
        self.handle, self.method = handle, method

    def remote(self, *args: Any) -> Any:
        if self.method == "generate_to":
            assert self.handle.stream is not None
            return self.handle.stream.generate_to(*args)
        if self.method == "tokenize":
            self.handle.pending.append(asyncio.get_running_loop().create_future())
            return self.handle.pending[-1]
        self.handle.calls.append(self.method)
        return asyncio.sleep(0)


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


@pytest.mark.parametrize(
    ("error", "expected", "reported"),
    [
        (BackPressureError(num_queued_requests=1, max_queued_requests=1), OverloadedError, False),
        (ActorDiedError(), StageUnavailableError, True),
        (EngineDeadError("The engine died: x"), EngineDeadError, True),
    ],
)
async def test_an_error_in_the_calls_answer_ends_the_stream_after_its_chunks(
    inbox: Inbox, error: BaseException, expected: type[Exception], reported: bool
) -> None:
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


async def test_an_answer_with_calls_still_in_flight_stands_for_the_stage_health_check() -> None:
    handle = RecordingHandle()
    tokenizer = HandleTokenizer(handle)  # type: ignore[arg-type]
    request = TokenizeRequest(TextPrompt("hi"), add_special_tokens=True)
    first, second = (asyncio.create_task(tokenizer.tokenize(request)) for _ in range(2))
    await asyncio.sleep(0)
    await tokenizer.check_health()
    assert handle.calls == ["check_health"]  # in flight, but no answer yet: the stage is asked
    handle.pending[0].set_result("tokens")
    assert await first == "tokens"
    await tokenizer.check_health()
    assert handle.calls == ["check_health"]  # answered just now, one still in flight: not asked
    handle.pending[1].set_exception(OverloadedError("full", code="overloaded", stage="tokenizer", reason="x"))
    with pytest.raises(OverloadedError):
        await second
    await tokenizer.check_health()
    assert handle.calls == ["check_health"] * 2  # nothing in flight: asked


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


def test_a_name_outside_the_client_protocol_is_not_forwarded(app_args: AppArgs) -> None:
    tokenizer = HandleTokenizer(InProcessHandle(deployment_class(Tokenizer)(app_args)))  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="not a method of TokenizerClient"):
        tokenizer.tokenize_sync  # noqa: B018  # the stage has it; its client Protocol does not
