"""serve_app/ingress/closing_response.py: a streamed chat or text completion gives its engine request and
its work ticket back when the client is gone, also when Starlette never starts the body; its last event
ends the body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from serve_app.config import AdmissionConfig, AppArgs
from serve_app.ingress import sse
from serve_app.ingress.chat.protocol import ChatCompletionRequest
from serve_app.ingress.chat.serving import create_chat_completion
from serve_app.ingress.closing_response import ClosingStreamingResponse, FinalChunk
from serve_app.ingress.completions.protocol import CompletionRequest
from serve_app.ingress.completions.serving import create_completion
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import GenerateRequest, GenerationChunk
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import FakeLLM

SCOPE = {"type": "http", "asgi": {"spec_version": "2.4"}}


class SlowLLM(FakeLLM):
    """Each chunk takes a while: a client gone mid-stream leaves the engine still generating."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        async for chunk in super().generate(request):
            await asyncio.sleep(0.02)
            yield chunk


def with_work_admission(app_args: AppArgs, tokenizer_stage: TokenizerStage, llm: FakeLLM) -> Services:
    """Services with admission by work, so that every stream holds a work ticket."""
    admission = AdmissionConfig(prefill_tokens_per_s=1e6, decode_tokens_per_s=10, max_wait_s=60.0)
    args = app_args.model_copy(update={"admission": admission})
    return Services.create(args, tokenizer_stage, llm)


@pytest.fixture
def admitting(app_args: AppArgs, tokenizer_stage: TokenizerStage, fake_llm: FakeLLM) -> Services:
    return with_work_admission(app_args, tokenizer_stage, fake_llm)


@pytest.fixture
def slow(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> Services:
    return with_work_admission(app_args, tokenizer_stage, SlowLLM())


async def start(services: Services, endpoint: str, **options: Any) -> Any:
    if endpoint == "chat":
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True, **options}
        return await create_chat_completion(services, ChatCompletionRequest.model_validate(chat))
    text = {"prompt": ["one", "two", "three"], "max_tokens": 5, "stream": True, **options}
    return await create_completion(services, CompletionRequest.model_validate(text))


def assert_all_given_back(services: Services) -> None:
    assert services.work is not None and (services.work.live, services.work.backlog_s) == (0, 0.0)
    assert services.metrics.registry.get_sample_value("serve_graph_stage_in_flight", {"stage": "llm"}) == 0


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_a_client_gone_before_the_first_byte_gives_its_work_back(
    admitting: Services, fake_llm: FakeLLM, endpoint: str
) -> None:
    response = await start(admitting, endpoint)
    assert admitting.work is not None and admitting.work.live > 0

    async def gone(message: Any) -> None:
        raise OSError("the client went away")

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnect):
        await response(SCOPE, receive, gone)  # the body iterator never starts
    assert sorted(fake_llm.closed) == sorted(r.request_id for r in fake_llm.requests)  # the engine aborted each
    assert_all_given_back(admitting)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_a_client_gone_mid_stream_gives_its_work_back(slow: Services, endpoint: str) -> None:
    response = await start(slow, endpoint)
    sent: list[Any] = []

    async def goes_after_two_events(message: Any) -> None:
        if len(sent) == 3:  # the start and two events
            raise OSError("the client went away")
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnect):
        await response(SCOPE, receive, goes_after_two_events)  # the body is left suspended at its third event
    assert_all_given_back(slow)


async def body_of(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def sends(response: ClosingStreamingResponse, spec_version: str = "2.4") -> list[Any]:
    """The ASGI messages `response` sends to a client that stays (before ASGI 2.4, as uvicorn's HTTP scope
    says, Starlette listens for the client's disconnect beside the body)."""
    sent: list[Any] = []

    async def record(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        never: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        return await never  # the client never goes

    await response({"type": "http", "asgi": {"spec_version": spec_version}}, receive, record)
    return sent


async def nothing() -> None:
    pass


@pytest.mark.parametrize(
    ("parts", "bodies"),
    [
        ([b"a", FinalChunk(b"b")], [(b"a", True), (b"b", False)]),  # the final chunk ends the body
        ([b"a", b"b"], [(b"a", True), (b"b", True), (b"", False)]),  # without one, as Starlette does
    ],
)
async def test_a_final_chunk_is_sent_as_the_end_of_the_body(parts: list[bytes], bodies: list[Any]) -> None:
    sent = await sends(ClosingStreamingResponse(body_of(parts), nothing))
    assert sent[0]["type"] == "http.response.start"
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == bodies


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_a_stream_ends_its_body_with_its_last_event_and_done(
    admitting: Services, fake_llm: FakeLLM, endpoint: str, include_usage: bool, spec_version: str
) -> None:
    """Each choice's finishing event is sent (completions: three prompts), and the last event goes out with
    [DONE] as the end of the body: no message after it. Every engine stream ended on its own first: none
    was closed (in the graph: cancelled in Serve, aborted in the engine)."""
    request = await start(admitting, endpoint, n=2, stream_options={"include_usage": include_usage})
    sent = await sends(request, spec_version)
    *events, last = [m["body"] for m in sent[1:]]
    assert [m["more_body"] for m in sent[1:]] == [True] * len(events) + [False]
    assert last.endswith(b"\n\ndata: [DONE]\n\n") and last.count(b"data: ") == 2
    payloads = [json.loads(event[len(b"data: ") :]) for event in [*events, last[: -len(sse.DONE)]]]
    finished = [c["index"] for p in payloads for c in p["choices"] if c["finish_reason"] is not None]
    assert sorted(finished) == list(range(2 if endpoint == "chat" else 6))
    assert ("usage" in payloads[-1]) is include_usage
    assert fake_llm.closed == []
    assert len(fake_llm.requests) == (1 if endpoint == "chat" else 3)
    assert_all_given_back(admitting)
