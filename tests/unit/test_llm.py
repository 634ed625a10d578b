"""serve_app/stages/llm.py driven by a fake engine (no vLLM engine process).

What the engine yields is vLLM's own `RequestOutput`; `SamplingParams`, `Logprob` and `EngineDeadError`
are the real classes too.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from vllm.logprobs import Logprob
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

from serve_app.errors import (
    BadRequestError,
    DeadlineExceededError,
    EngineDeadError,
    OverloadedError,
    ServiceUnavailableError,
)
from serve_app.messages import (
    ChoiceDelta,
    Deadline,
    GenerateRequest,
    GenerationChunk,
    ProcessedImage,
    SamplingSpec,
    TokenLogprob,
)
from serve_app.stages.llm import LLMStage, to_chunk
from tests.unit.vllm_support import FakeEngine, completion, output, request, request_output, stream_of


async def collect(stage: LLMStage, req: GenerateRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in stage.generate(req)]


async def test_chunks_are_converted() -> None:
    outputs = [
        request_output(completion(0, "He", [10, 11]), completion(1, "Yo", [12])),
        request_output(completion(1, "!", [13], "stop", "!"), completion(0, "y", [14], "length"), finished=True),
    ]
    engine = FakeEngine(outputs)
    chunks = await collect(LLMStage(engine), request(n=2))
    engine_ttft_s = chunks[0].engine_ttft_s  # the first chunk only: the engine's time to first output
    assert engine_ttft_s is not None and 0 <= engine_ttft_s < 1
    assert chunks == [
        GenerationChunk([ChoiceDelta(0, "He", [10, 11], None), ChoiceDelta(1, "Yo", [12], None)], False, engine_ttft_s),
        GenerationChunk([ChoiceDelta(1, "!", [13], "stop", "!"), ChoiceDelta(0, "y", [14], "length")], True),
    ]
    assert engine.exit == "finished"
    [(prompt, params, request_id)] = engine.calls
    assert prompt == {"type": "token", "prompt_token_ids": [1, 2, 3]}  # rendered: no renderer thread hop
    assert request_id == "req-1"
    assert (params.n, params.max_tokens, params.output_kind) == (2, 8, RequestOutputKind.DELTA)


async def test_the_models_sampling_defaults_reach_the_engine() -> None:
    engine = FakeEngine([request_output(completion(0, "a", [5], "length"), finished=True)])
    await collect(LLMStage(engine, defaults={"temperature": 0.6, "top_p": 0.9}), request(top_p=0.5))
    [(_, params, _)] = engine.calls
    assert (params.temperature, params.top_p) == (0.6, 0.5)  # left out: the model's; given: the request's


async def test_images_go_to_the_engine_as_a_raw_prompt_for_its_multimodal_processor() -> None:
    engine = FakeEngine([request_output(completion(0, "a", [5], "length"), finished=True)])
    pixels = np.zeros((2, 2, 3), np.uint8)
    image = ProcessedImage(pixels, "h", 4, cache_hit=False)
    req = GenerateRequest("req-1", [1, 2, 3], SamplingSpec(max_tokens=1), images=[image])
    await collect(LLMStage(engine), req)
    [(prompt, _, _)] = engine.calls
    assert "type" not in prompt  # vLLM renders it, running the model's processor
    assert prompt["prompt_token_ids"] == [1, 2, 3]
    assert prompt["multi_modal_data"]["image"][0] is pixels
    assert prompt["multi_modal_uuids"] == {"image": ["h"]}


async def test_outputs_sooner_than_the_stream_interval_go_out_merged() -> None:
    engine = FakeEngine([output((0, "He", [1])), output((0, "ll", [2])), output((0, "o", [3]), finished=True)])
    chunks = await collect(LLMStage(engine, stream_interval_s=1000.0), request())
    assert [(c.deltas[0].text, c.deltas[0].token_ids, c.finished) for c in chunks] == [
        ("He", [1], False),  # the first at once, with the engine's time to it
        ("llo", [2, 3], True),  # the rest merged; the last is never held
    ]
    assert chunks[0].engine_ttft_s is not None and chunks[1].engine_ttft_s is None
    assert engine.exit == "finished"


def test_to_chunk_without_prompt_ids() -> None:
    chunk = to_chunk(request_output(completion(0, "", []), prompt_token_ids=None), SamplingSpec(max_tokens=1))
    assert chunk == GenerationChunk([ChoiceDelta(0, "", [], None)], False)


async def test_priority_goes_to_the_engine_beside_the_sampling_params() -> None:
    engine = FakeEngine([output((0, "x", [1]), finished=True)])
    await collect(LLMStage(engine), request())
    await collect(LLMStage(engine), request(priority=-3))
    assert engine.priorities == [0, -3]


async def test_invalid_sampling_fails_before_the_engine_is_called() -> None:
    engine = FakeEngine([output((0, "x", [1]))])
    with pytest.raises(BadRequestError):
        await collect(LLMStage(engine), request(n=0))
    assert engine.calls == []


def test_logprobs_are_converted_with_floor_and_rank_order() -> None:
    first = {
        30: Logprob(-3.0, rank=3, decoded_token="c"),
        10: Logprob(-0.5, rank=2, decoded_token="a"),
        20: Logprob(-0.1, rank=1, decoded_token="b"),
    }
    second = {
        22: Logprob(-20000.0, rank=2, decoded_token="x"),
        11: Logprob(-math.inf, rank=5, decoded_token="d"),
        21: Logprob(-1.0, rank=1, decoded_token="é"),
    }
    third = {12: Logprob(math.nan, rank=1, decoded_token=None)}
    output = request_output(completion(0, "adz", [10, 11, 12], logprobs=[first, second, third]))
    [delta] = to_chunk(output, SamplingSpec(max_tokens=3, logprobs=2)).deltas
    assert delta.logprobs == [
        TokenLogprob("a", -0.5, [97], [("b", -0.1, [98]), ("a", -0.5, [97])]),
        TokenLogprob("d", -9999.0, [100], [("é", -1.0, [195, 169]), ("x", -9999.0, [120])]),
        TokenLogprob("", -9999.0, [], [("", -9999.0, [])]),
    ]


def test_logprobs_zero_keeps_only_the_chosen_token() -> None:
    candidates = {10: Logprob(-0.5, rank=2, decoded_token="a"), 20: Logprob(-0.1, rank=1, decoded_token="b")}
    output = request_output(completion(0, "a", [10], logprobs=[candidates]))
    [delta] = to_chunk(output, SamplingSpec(max_tokens=1, logprobs=0)).deltas
    assert delta.logprobs == [TokenLogprob("a", -0.5, [97], [])]


def test_prompt_logprobs_come_with_the_first_chunk_without_the_first_tokens_none() -> None:
    # vLLM's prompt logprobs: None for the first token, then each prompt token with its alternatives.
    second = {2: Logprob(-1.5, rank=2, decoded_token=" b"), 7: Logprob(-0.2, rank=1, decoded_token=" z")}
    third = {3: Logprob(-0.1, rank=1, decoded_token=" c")}
    output = request_output(completion(0, "x", [9]))
    output.prompt_logprobs = [None, second, third]
    chunk = to_chunk(output, SamplingSpec(max_tokens=1, prompt_logprobs=1))
    assert chunk.prompt_logprobs == [
        TokenLogprob(" b", -1.5, [32, 98], [(" z", -0.2, [32, 122])]),
        TokenLogprob(" c", -0.1, [32, 99], [(" c", -0.1, [32, 99])]),
    ]
    assert to_chunk(output, SamplingSpec(max_tokens=1)).prompt_logprobs is None  # not asked for


def test_the_engines_prompt_ids_come_with_the_first_chunk_when_asked() -> None:
    output = request_output(completion(0, "x", [9]), prompt_token_ids=(1, 2, 2, 2, 3))  # an image expanded
    asked = SamplingSpec(max_tokens=2, return_prompt_ids=True)
    assert to_chunk(output, asked, engine_ttft_s=0.1).prompt_token_ids == [1, 2, 2, 2, 3]
    assert to_chunk(output, asked).prompt_token_ids is None  # a later chunk
    assert to_chunk(output, SamplingSpec(max_tokens=2), engine_ttft_s=0.1).prompt_token_ids is None  # not asked


def test_logprobs_not_requested_are_dropped() -> None:
    candidates = {10: Logprob(-0.5, rank=1, decoded_token="a")}
    output = request_output(completion(0, "a", [10], logprobs=[candidates]))
    assert to_chunk(output, SamplingSpec(max_tokens=1)).deltas[0].logprobs is None


async def test_closing_the_stage_stream_closes_the_engine_generator() -> None:
    engine = FakeEngine([output((0, "a", [1])), output((0, "b", [2])), output((0, "c", [3]))])
    stream = stream_of(LLMStage(engine), request())
    first = await anext(stream)
    assert first.deltas[0].text == "a"
    assert engine.exit is None
    await stream.aclose()  # what Serve does when the client disconnects
    assert engine.exit == "closed"


async def test_cancelling_the_consumer_cancels_the_engine_generator() -> None:
    engine = FakeEngine([output((0, "a", [1]))])
    engine.wait = asyncio.Event()  # never set: the engine is busy generating
    stream = stream_of(LLMStage(engine), request())
    await anext(stream)
    task = asyncio.create_task(anext(stream))
    await engine.waiting.wait()  # the engine is now busy inside its generator
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.exit == "cancelled"


@pytest.mark.parametrize("outputs", [[], [output((0, "a", [1]))]])
async def test_engine_death_becomes_engine_dead_error(outputs: list[RequestOutput]) -> None:
    dead = VLLMEngineDeadError()
    engine = FakeEngine(outputs, error=dead)
    chunks: list[GenerationChunk] = []
    with pytest.raises(EngineDeadError) as info:
        async for chunk in LLMStage(engine).generate(request()):
            chunks.append(chunk)
    assert len(chunks) == len(outputs)
    assert info.value.status_code == 503
    assert info.value.message.startswith("The engine died: EngineCore encountered an issue.")
    assert info.value.__cause__ is dead


@pytest.mark.parametrize("error", [ValueError("prompt too long"), BadRequestError("x")])
async def test_engine_value_errors_become_400(error: Exception) -> None:
    with pytest.raises(BadRequestError) as info:
        await collect(LLMStage(FakeEngine([], error=error)), request())
    assert info.value.status_code == 400


@pytest.mark.parametrize("error", [ValueError("bug"), TypeError("bug")])
async def test_value_errors_after_the_first_chunk_are_not_400(error: Exception) -> None:
    # vLLM checks a request before its first output: later, such an error is a fault, not the client's.
    chunks: list[GenerationChunk] = []
    with pytest.raises(type(error), match="bug"):
        async for chunk in LLMStage(FakeEngine([output((0, "a", [1]))], error=error)).generate(request()):
            chunks.append(chunk)
    assert len(chunks) == 1


async def test_engine_validation_error_becomes_400() -> None:
    from vllm.exceptions import VLLMValidationError

    error = VLLMValidationError("prompt is too long", parameter="prompt")
    with pytest.raises(BadRequestError) as info:
        await collect(LLMStage(FakeEngine([], error=error)), request())
    assert info.value.message == "prompt is too long (parameter=prompt)"


async def test_other_engine_errors_pass_through() -> None:
    with pytest.raises(RuntimeError, match="kaboom"):
        await collect(LLMStage(FakeEngine([], error=RuntimeError("kaboom"))), request())


async def test_check_health_and_delegation() -> None:
    engine = FakeEngine([])
    stage = LLMStage(engine)
    await stage.check_health()
    engine.health_error = RuntimeError("no heartbeat")
    with pytest.raises(ServiceUnavailableError, match="engine unhealthy: no heartbeat"):
        await stage.check_health()
    assert stage.num_unfinished_requests() == 7
    stage.shutdown()
    assert engine.shut_down


async def test_local_llm_client_wraps_the_stage() -> None:
    engine = FakeEngine([output((0, "a", [1]), finished=True)])
    client = LLMStage(engine)
    assert [c.deltas[0].text async for c in client.generate(request())] == ["a"]
    assert await client.metrics_text() == ""
    await client.check_health()  # healthy: it returns without raising
    with pytest.raises(BadRequestError, match="n must be 1 when using greedy sampling"):
        await anext(aiter(client.generate(request(n=2, temperature=0.0))))


async def test_the_engine_queue_bound_counts_sequences_and_frees_them() -> None:
    engine = FakeEngine([output((0, "a", [1]))])
    engine.wait = asyncio.Event()
    stage = LLMStage(engine, max_seqs=3)
    held = stream_of(stage, request(n=2))
    await anext(held)  # two sequences in the engine
    with pytest.raises(OverloadedError) as raised:
        await anext(stage.generate(request(n=2)))  # 2 + 2 > 3
    assert (raised.value.stage, raised.value.reason, raised.value.code) == ("llm", "engine_queue_full", "overloaded")
    assert len(engine.calls) == 1  # refused before the engine saw it
    one = stream_of(stage, request(n=1))
    await anext(one)  # 2 + 1 fits
    await one.aclose()
    await held.aclose()  # closed streams give their sequences back
    engine.wait.set()
    assert len(await collect(stage, request(n=3))) == 1


async def test_more_choices_than_the_engine_holds_is_a_400() -> None:
    with pytest.raises(BadRequestError) as raised:
        await collect(LLMStage(FakeEngine([]), max_seqs=2), request(n=3))
    assert raised.value.param == "n"


async def test_a_request_past_its_deadline_never_reaches_the_engine() -> None:
    engine = FakeEngine([output((0, "a", [1]))])
    late = GenerateRequest("req-1", [1, 2, 3], SamplingSpec(max_tokens=8), deadline=Deadline.after(-1))
    with pytest.raises(DeadlineExceededError, match="llm"):
        await collect(LLMStage(engine), late)
    assert engine.calls == []
    on_time = GenerateRequest("req-2", [1, 2, 3], SamplingSpec(max_tokens=8), deadline=Deadline.after(60))
    assert len(await collect(LLMStage(engine), on_time)) == 1
