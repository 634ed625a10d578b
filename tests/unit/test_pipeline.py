"""serve_app/ingress/pipeline/{generation,validation,streams,responses}.py: merge, request checks, start_stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.config import AppArgs
from serve_app.errors import BadRequestError, EngineDeadError, NotFoundError
from serve_app.ingress.pipeline.generation import start_stream
from serve_app.ingress.pipeline.responses import new_request_id, timing_headers
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.streams import ChoiceState, merge
from serve_app.ingress.pipeline.validation import check_limits, check_model
from serve_app.ingress.protocol import SamplingRequest
from serve_app.messages import ChoiceDelta, GenerationChunk, TextPrompt, TokenizedPrompt, TokenLogprob


def chunk(text: str, finish: str | None = None) -> GenerationChunk:
    return GenerationChunk([ChoiceDelta(0, text, [1], finish)], finish is not None)


class Source:
    """An async iterator fed by the test; records whether it was cancelled while waiting."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[GenerationChunk | BaseException | None] = asyncio.Queue()
        self.cancelled = False

    async def stream(self) -> AsyncIterator[GenerationChunk]:
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_merge_yields_in_arrival_order_tagged_by_stream() -> None:
    sources = [Source() for _ in range(3)]
    merged = merge([s.stream() for s in sources])
    for i, text in [(2, "a"), (0, "b"), (2, "c"), (1, "d"), (0, "e")]:
        sources[i].queue.put_nowait(chunk(text))
        assert await anext(merged) == (i, chunk(text))
    for s in sources:
        s.queue.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        await anext(merged)
    assert not any(s.cancelled for s in sources)


async def test_merge_keeps_every_chunk_and_per_stream_order() -> None:
    async def gen(prefix: str, count: int) -> AsyncIterator[GenerationChunk]:
        for i in range(count):
            await asyncio.sleep(0)
            yield chunk(f"{prefix}{i}")

    result = [(i, c.deltas[0].text) async for i, c in merge([gen("x", 5), gen("y", 0), gen("z", 3)])]
    assert sorted(result) == [(0, f"x{i}") for i in range(5)] + [(2, f"z{i}") for i in range(3)]
    assert [t for i, t in result if i == 0] == [f"x{i}" for i in range(5)]
    assert [t for i, t in result if i == 2] == ["z0", "z1", "z2"]


async def test_merge_of_one_stream() -> None:
    async def gen() -> AsyncIterator[GenerationChunk]:
        yield chunk("a")
        yield chunk("b", "stop")

    assert [x async for x in merge([gen()])] == [(0, chunk("a")), (0, chunk("b", "stop"))]


async def test_merge_raises_the_first_error_and_cancels_the_others() -> None:
    sources = [Source() for _ in range(3)]
    merged = merge([s.stream() for s in sources])
    sources[1].queue.put_nowait(chunk("a"))
    assert await anext(merged) == (1, chunk("a"))
    error = BadRequestError("bad prompt")
    sources[1].queue.put_nowait(error)
    with pytest.raises(BadRequestError) as info:
        await anext(merged)
    assert info.value is error
    assert (sources[0].cancelled, sources[2].cancelled) == (True, True)


async def test_closing_merge_early_cancels_every_stream() -> None:
    sources = [Source() for _ in range(3)]
    merged = merge([s.stream() for s in sources])
    sources[0].queue.put_nowait(chunk("a"))
    assert await anext(merged) == (0, chunk("a"))
    await merged.aclose()  # the client went away
    assert [s.cancelled for s in sources] == [True, True, True]


def test_check_model(services: Services) -> None:
    assert check_model(services, None) == "tiny-chat"
    assert check_model(services, "tiny-chat") == "tiny-chat"
    with pytest.raises(NotFoundError) as info:
        check_model(services, "gpt-4")
    assert info.value.status_code == 404
    assert info.value.to_dict()["error"] == {
        "message": "The model `gpt-4` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": "model_not_found",
    }


def test_check_limits(services: Services, app_args: AppArgs) -> None:
    assert (app_args.limits.max_n, app_args.limits.max_logprobs) == (4, 5)
    check_limits(services, SamplingRequest(n=4), 5)
    check_limits(services, SamplingRequest(n=1), None)
    with pytest.raises(BadRequestError) as info:
        check_limits(services, SamplingRequest(n=5), None)
    assert (info.value.param, info.value.message) == ("n", "n must be at most 4, got 5.")
    with pytest.raises(BadRequestError) as info:
        check_limits(services, SamplingRequest(n=1), 6)
    assert (info.value.param, info.value.message) == ("logprobs", "logprobs must be at most 5, got 6.")


def test_timing_headers() -> None:
    timings = {"tokenizer": 0.0015, "tokenizer_call": 0.1, "llm_first_chunk": 0.25, "total": 2.5}
    assert timing_headers(timings) == {
        "X-Tokenizer-Time": "1.500",
        "X-LLM-First-Chunk-Time": "250.000",
        "X-Total-Time": "2500.000",
    }
    assert timing_headers({}) == {}


def test_new_request_id() -> None:
    a, b = new_request_id("cmpl"), new_request_id("cmpl")
    assert a.startswith("cmpl-") and len(a) == len("cmpl-") + 32
    assert a != b


def test_choice_state_accumulates() -> None:
    state = ChoiceState()
    lp = TokenLogprob("a", -0.5, [97], [])
    state.add(ChoiceDelta(0, "Hel", [1, 2], None, logprobs=[lp]))
    state.add(ChoiceDelta(0, "lo", [3], "stop", stop_reason="</s>", logprobs=[lp]))
    assert ("".join(state.text), state.num_tokens, state.logprobs) == ("Hello", 3, [lp, lp])
    assert (state.finish_reason, state.stop_reason) == ("stop", "</s>")


class StubTokenizer:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def tokenize(self, request: Any) -> TokenizedPrompt:
        self.requests.append(request)
        return TokenizedPrompt([7, 8, 9], 5, 0.002)

    async def detokenize(self, token_ids: list[int]) -> str:
        return ""

    async def speech_layout(self) -> OrpheusLayout | None:
        return None  # a text model

    async def check_health(self) -> None:
        return None


class StubLLM:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.requests: list[Any] = []

    async def generate(self, request: Any) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        yield chunk("a")
        yield chunk("b", "length")

    async def check_health(self) -> None:
        return None

    async def metrics_text(self) -> str:
        return ""


async def test_start_stream(app_args: AppArgs) -> None:
    tokenizer, llm = StubTokenizer(), StubLLM()
    services = Services.create(app_args, tokenizer, llm)
    request = SamplingRequest(max_tokens=5, truncate_prompt_tokens=3, n=2, temperature=0.5)
    stream = await start_stream(
        services, request, TextPrompt(text="hi"), add_special_tokens=True, logprobs=2, request_id="cmpl-x"
    )
    [tok_request] = tokenizer.requests
    assert (tok_request.prompt, tok_request.add_special_tokens) == (TextPrompt(text="hi"), True)
    assert (tok_request.truncate_prompt_tokens, tok_request.max_tokens, tok_request.check_context) == (
        3,
        5,
        True,
    )
    [gen_request] = llm.requests
    assert (gen_request.request_id, gen_request.prompt_token_ids) == ("cmpl-x", [7, 8, 9])
    spec = gen_request.sampling
    assert (spec.max_tokens, spec.n, spec.temperature, spec.logprobs) == (5, 2, 0.5, 2)
    assert (stream.request_id, stream.prompt_token_ids, stream.first) == ("cmpl-x", [7, 8, 9], chunk("a"))
    assert set(stream.timings) == {"tokenizer", "tokenizer_call", "llm_first_chunk", "first_token"}
    assert stream.timings["tokenizer"] == 0.002
    assert [c async for c in stream.chunks()] == [chunk("a"), chunk("b", "length")]
    assert 'serve_graph_tokens_total{kind="prompt"} 3.0' in services.metrics.render().decode()


async def test_engine_death_on_first_chunk_marks_llm_unhealthy(app_args: AppArgs) -> None:
    services = Services.create(app_args, StubTokenizer(), StubLLM(EngineDeadError("The engine died: x")))
    with pytest.raises(EngineDeadError):
        await start_stream(
            services,
            SamplingRequest(),
            TextPrompt(text="hi"),
            add_special_tokens=True,
            logprobs=None,
            request_id="r",
        )
    assert services.health.report() == (False, {"tokenizer": "starting", "llm": "The engine died: x"})


async def test_priority_reaches_the_llm_only_where_the_engine_schedules_by_it(app_args: AppArgs) -> None:
    async def start(services: Services, priority: int) -> None:
        await start_stream(
            services, SamplingRequest(priority=priority), TextPrompt(text="hi"), add_special_tokens=True,
            logprobs=None, request_id="r",
        )  # fmt: skip

    tokenizer, llm = StubTokenizer(), StubLLM()
    with pytest.raises(BadRequestError) as refused:
        await start(Services.create(app_args, tokenizer, llm), -1)
    assert (refused.value.status_code, refused.value.param) == (400, "priority")
    assert "engine.scheduling_policy: fcfs" in refused.value.message
    assert tokenizer.requests == [] and llm.requests == []  # refused before any stage
    await start(Services.create(app_args, tokenizer, llm), 0)  # 0 is every request's: always accepted

    by_priority = app_args.model_copy(
        update={"engine": app_args.engine.model_copy(update={"scheduling_policy": "priority"})}
    )
    await start(Services.create(by_priority, tokenizer, llm), -1)
    assert [r.sampling.priority for r in llm.requests] == [0, -1]
