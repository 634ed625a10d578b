"""vLLM's own output objects, built for the tests of the stages that read them."""

from __future__ import annotations

from vllm.outputs import CompletionOutput, RequestOutput


def output(*choices: tuple[int, str, list[int]], finished: bool = False) -> RequestOutput:
    """A `RequestOutput` of request "req-1" with one `CompletionOutput` per (index, text, token ids)."""
    completions = [
        CompletionOutput(index, text, ids, None, None, finish_reason="length" if finished else None)
        for index, text, ids in choices
    ]
    return RequestOutput("req-1", None, [1, 2, 3], None, completions, finished)
