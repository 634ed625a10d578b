"""Request deadlines: the header and config (serve_app/ingress/pipeline/deadline.py), each stage refusing late work,
and the ingress giving up at the deadline (504 JSON, or an SSE error event once the stream has started)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter

from serve_app.config import LimitsConfig
from serve_app.errors import BadRequestError, DeadlineExceededError
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.deadline import HEADER, request_deadline, within
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import ChoiceDelta, Deadline, GenerateRequest, GenerationChunk, TextPrompt, TokenizeRequest
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.admission_support import gated
from tests.unit.conftest import MODEL_NAME, FakeLLM

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
PAST = Deadline.after(-1)


class StallingLLM(FakeLLM):
    """Sends `chunks` chunks, then never another: a long generation."""

    def __init__(self, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        try:
            for _ in range(self.chunks):
                yield GenerationChunk([ChoiceDelta(0, "a", [64], None)], False)
            await asyncio.sleep(3600)
        finally:
            self.closed.append(request.request_id)


def counter() -> tuple[Counter, CollectorRegistry]:
    registry = CollectorRegistry()
    return Counter("rejections", "test", ["stage", "reason"], registry=registry), registry


def test_no_header_takes_the_config_default() -> None:
    assert request_deadline(LimitsConfig(), None) is None
    deadline = request_deadline(LimitsConfig(request_timeout_s=30), None)
    assert deadline is not None and 29 < deadline.remaining() <= 30


def test_the_header_is_capped_by_the_config() -> None:
    limits = LimitsConfig(request_timeout_s=30, max_request_timeout_s=60)
    short, capped = request_deadline(limits, "0.5"), request_deadline(limits, "1e6")
    assert short is not None and 0 < short.remaining() <= 0.5
    assert capped is not None and 59 < capped.remaining() <= 60


def test_a_deadline_counts_from_the_given_start() -> None:
    deadline = request_deadline(LimitsConfig(max_request_timeout_s=60), "2.5", start=1000.0)
    assert deadline == Deadline(1002.5)


def test_the_deadline_counts_from_the_requests_arrival(client: TestClient, fake_llm: FakeLLM) -> None:
    raw = json.dumps(CHAT).encode()

    def slow_body() -> Iterator[bytes]:
        yield raw[:10]
        time.sleep(0.5)  # the body still coming in: the route's own clock reads after it
        yield raw[10:]

    sent = time.time()
    response = client.post(
        "/v1/chat/completions", content=slow_body(), headers={HEADER: "600", "Content-Type": "application/json"}
    )
    assert response.status_code == 200
    [request] = fake_llm.requests
    assert request.deadline is not None and sent <= request.deadline.at - 600 < sent + 0.4


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", ""])
def test_a_bad_header_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(BadRequestError) as raised:
        request_deadline(LimitsConfig(), value)
    assert raised.value.param == HEADER


def test_a_bad_header_over_http(client: TestClient, fake_llm: FakeLLM) -> None:
    response = client.post("/v1/chat/completions", json=CHAT, headers={HEADER: "soon"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == HEADER
    assert fake_llm.requests == []


async def test_within_ends_the_wait_at_the_deadline() -> None:
    rejections, registry = counter()
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError) as raised:
        async with within(Deadline.after(0.05), "tokenizer", rejections):
            await asyncio.sleep(10)
    assert time.monotonic() - start < 1
    assert (raised.value.status_code, raised.value.code) == (504, "deadline_exceeded")
    assert registry.get_sample_value("rejections_total", {"stage": "tokenizer", "reason": "deadline"}) == 1


async def test_within_counts_a_stages_refusal_and_passes_other_errors() -> None:
    rejections, registry = counter()
    with pytest.raises(DeadlineExceededError):
        async with within(Deadline.after(10), "llm", rejections):
            DeadlineExceededError.check(PAST, "llm")
    with pytest.raises(TimeoutError):  # not the deadline's: passed through as it is
        async with within(Deadline.after(10), "llm", rejections):
            raise TimeoutError
    async with within(None, "llm", rejections):
        await asyncio.sleep(0)
    assert registry.get_sample_value("rejections_total", {"stage": "llm", "reason": "deadline"}) == 1


def test_the_tokenizer_stage_refuses_late_work(tokenizer_stage: TokenizerStage) -> None:
    with pytest.raises(DeadlineExceededError, match="tokenizer"):
        tokenizer_stage.tokenize_sync(TokenizeRequest(TextPrompt("hi"), True, deadline=PAST))
    assert tokenizer_stage.tokenize_sync(TokenizeRequest(TextPrompt("hi"), True, deadline=Deadline.after(60))).token_ids


def test_a_unary_request_past_its_deadline_is_a_504_and_stops_the_engine(
    client: TestClient, services: Services
) -> None:
    llm = services.llm = StallingLLM(chunks=1)
    sent = time.time()
    response = client.post("/v1/chat/completions", json=CHAT, headers={HEADER: "0.3"})
    assert time.time() - sent < 5
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    assert response.json()["error"]["type"] == "GatewayTimeoutError"
    assert llm.closed == [llm.requests[0].request_id]
    deadline = llm.requests[0].deadline  # the absolute deadline travelled to the stage
    assert deadline is not None and 0.3 <= deadline.at - sent < 0.5


def test_a_started_stream_ends_with_an_error_event_then_done(
    client: TestClient, services: Services, sse_events: Any
) -> None:
    llm = services.llm = StallingLLM(chunks=2)
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers={HEADER: "0.3"})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "deadline_exceeded"
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-2]] == ["a", "a"]
    assert llm.closed == [llm.requests[0].request_id]
    metrics = client.get("/metrics").text
    assert 'serve_graph_rejections_total{reason="deadline",stage="llm"} 1.0' in metrics


def test_the_config_default_applies_without_a_header(client: TestClient, services: Services) -> None:
    services.args = services.args.model_copy(
        update={"limits": services.args.limits.model_copy(update={"request_timeout_s": 0.2})}
    )
    services.llm = StallingLLM(chunks=0)
    assert client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hi"}).status_code == 504


def test_a_request_late_before_admission_by_work_is_a_counted_504(
    app_args: Any, tokenizer_stage: TokenizerStage
) -> None:
    client = TestClient(create_app(gated(app_args, tokenizer_stage)))
    # Passed on arrival: the early admission leaves it to the route, whose admission by work refuses it.
    response = client.post("/v1/chat/completions", json=CHAT, headers={HEADER: "0.000001"})
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    assert 'serve_graph_rejections_total{reason="deadline",stage="ingress"} 1.0' in client.get("/metrics").text
