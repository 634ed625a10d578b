"""vLLM's own output objects, built for the tests of the stages that read them, and a fake engine that
yields them to the llm stage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, cast

from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput

from serve_app.messages import GenerateRequest, GenerationChunk, SamplingSpec
from serve_app.stages.llm import LLMStage

PROMPT = (1, 2, 3)


def completion(
    index: int,
    text: str,
    token_ids: list[int],
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    logprobs: list[dict[int, Logprob]] | None = None,
) -> CompletionOutput:
    # No cumulative logprob: the stages read the per-token ones.
    return CompletionOutput(
        index, text, token_ids, None, logprobs, finish_reason=finish_reason, stop_reason=stop_reason
    )


def request_output(
    *completions: CompletionOutput, prompt_token_ids: tuple[int, ...] | None = PROMPT, finished: bool = False
) -> RequestOutput:
    """A `RequestOutput` of request "req-1"."""
    prompt = None if prompt_token_ids is None else list(prompt_token_ids)
    return RequestOutput("req-1", None, prompt, None, list(completions), finished)


def output(*choices: tuple[int, str, list[int]], finished: bool = False) -> RequestOutput:
    """A `RequestOutput` with one `CompletionOutput` per (index, text, token ids)."""
    finish_reason = "length" if finished else None
    return request_output(*(completion(i, text, ids, finish_reason) for i, text, ids in choices), finished=finished)


class FakeEngine:
    """Yields `outputs`, then raises `error`; `wait` (an Event) makes it hang after the outputs."""

    def __init__(self, outputs: list[RequestOutput], error: BaseException | None = None) -> None:
        self.outputs = outputs
        self.error = error
        self.wait: asyncio.Event | None = None
        self.waiting = asyncio.Event()
        self.calls: list[tuple[Any, Any, str]] = []
        self.priorities: list[int] = []
        self.exit: str | None = None
        self.health_error: BaseException | None = None
        self.shut_down = False

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncGenerator[Any, None]:
        self.calls.append((prompt, sampling_params, request_id))
        self.priorities.append(priority)
        try:
            for output in self.outputs:
                yield output
            if self.wait is not None:
                self.waiting.set()
                await self.wait.wait()
            if self.error is not None:
                raise self.error
        except GeneratorExit:
            self.exit = "closed"  # vLLM's AsyncLLM.generate aborts the request here
            raise
        except asyncio.CancelledError:
            self.exit = "cancelled"
            raise
        self.exit = "finished"

    async def check_health(self) -> None:
        if self.health_error is not None:
            raise self.health_error

    def get_num_unfinished_requests(self) -> int:
        return 7

    def shutdown(self) -> None:
        self.shut_down = True


def request(**sampling: Any) -> GenerateRequest:
    return GenerateRequest("req-1", [1, 2, 3], SamplingSpec(**{"max_tokens": 8, **sampling}))


def stream_of(stage: LLMStage, req: GenerateRequest) -> AsyncGenerator[GenerationChunk, None]:
    """`stage.generate(req)` as what it is, an async generator (its clients' Protocol types it `AsyncIterator`):
    these tests close it, as Serve does, and hand its `anext` to `create_task`, which takes a coroutine."""
    return cast(AsyncGenerator[GenerationChunk, None], stage.generate(req))
