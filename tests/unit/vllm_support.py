"""vLLM's own output objects, built for the tests of the stages that read them."""

from __future__ import annotations

from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput

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
