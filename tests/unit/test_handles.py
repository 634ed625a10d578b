"""deployments/handles.py: unary stage calls; a stage replica lost mid-call becomes a 503 naming the stage,
and is reported."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from deployments.handles import HandleTokenizer, HandleVocoder
from deployments.tokenizer import Tokenizer
from serve_app.config import AppArgs
from serve_app.errors import OverloadedError, PayloadTooLargeError, StageUnavailableError
from serve_app.messages import TextPrompt, TokenizeRequest, VocodeRequest
from tests.unit.conftest import deployment_class
from tests.unit.handle_fakes import (
    FailingHandle,
    InProcessHandle,
    Pending,
    PendingHandle,
    RecordingHandle,
)

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


async def test_leaving_a_unary_call_early_cancels_it_in_the_replica() -> None:
    response = Pending()
    tokenizer = HandleTokenizer(PendingHandle(response))  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # as the request's deadline does
            await tokenizer.tokenize(TokenizeRequest(TextPrompt("hi"), add_special_tokens=True))
    assert response.cancel_called


async def test_each_handle_method_calls_the_deployment_method_of_its_name(app_args: AppArgs) -> None:
    replica = deployment_class(Tokenizer)(app_args)
    tokenizer = HandleTokenizer(InProcessHandle(replica))  # type: ignore[arg-type]
    request = TokenizeRequest(TextPrompt("hello there"), add_special_tokens=True)
    tokenized = await tokenizer.tokenize(request)
    assert tokenized.token_ids == (await replica.tokenize(request)).token_ids
    assert await tokenizer.detokenize(tokenized.token_ids) == await replica.detokenize(tokenized.token_ids)
    assert await tokenizer.speech_layout() is None  # a text model
    await tokenizer.check_health()


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


def test_a_name_outside_the_client_protocol_is_not_forwarded(app_args: AppArgs) -> None:
    tokenizer = HandleTokenizer(InProcessHandle(deployment_class(Tokenizer)(app_args)))  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="not a method of TokenizerClient"):
        tokenizer.tokenize_sync  # noqa: B018  # the stage has it; its client Protocol does not
