"""Reading streamed chat and text completions: which chunks count as tokens, usage, failures."""

from __future__ import annotations

import json
from typing import Any

import httpx

from load.bench.sse import StreamState, stage_times_ms


def data(payload: dict[str, Any]) -> str:
    return "data: " + json.dumps(payload)


def chat(delta: dict[str, Any], finish: str | None = None) -> str:
    return data({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def text(t: str, finish: str | None = None) -> str:
    return data({"object": "text_completion", "choices": [{"index": 0, "text": t, "finish_reason": finish}]})


USAGE = data({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})


def feed(lines: list[str]) -> StreamState:
    state = StreamState()
    for i, line in enumerate(lines):
        state.feed(line, elapsed_s=float(i))
    return state


def test_chat_role_and_finish_chunks_are_not_tokens() -> None:
    lines = [chat({"role": "assistant", "content": ""}), "", chat({"content": "a"}), "", chat({"content": "bc"}),
             chat({}, finish="length"), USAGE, "data: [DONE]"]  # fmt: skip
    state = feed(lines)
    assert state.content_times == [2.0, 4.0]
    assert (state.prompt_tokens, state.output_tokens, state.done) == (7, 3, True)
    assert state.failure() is None


def test_text_completion_chunks() -> None:
    state = feed([": keep-alive", text("x"), text(""), text("y", finish="length"), USAGE, "data: [DONE]"])
    assert state.content_times == [1.0, 3.0]
    assert state.failure() is None


def test_failures() -> None:
    assert feed([text("x"), "data: [DONE]"]).failure() == "no usage in stream (stream_options.include_usage ignored?)"
    assert feed([text("x"), USAGE]).failure() == "stream ended without [DONE]"
    none = data({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}})
    assert feed([none, "data: [DONE]"]).failure() == "no content in stream"
    error = data({"error": {"message": "The stream failed: RuntimeError", "type": "x", "code": 500}})
    assert feed([text("x"), error, "data: [DONE]"]).failure() == "The stream failed: RuntimeError"
    assert feed(["data: {not json"]).failure() == "invalid SSE payload: {not json"


def test_tokens_without_text_are_a_complete_stream() -> None:
    state = feed([chat({"role": "assistant", "content": ""}), chat({}, finish="length"), USAGE, "data: [DONE]"])
    assert state.content_times == [] and state.output_tokens == 3
    assert state.failure() is None


def test_stage_headers() -> None:
    headers = httpx.Headers({"x-tokenizer-time": "1.250", "X-LLM-First-Chunk-Time": "30.5", "X-Other": "1",
                             "X-LLM-Engine-Time": "25", "X-First-Token-Time": "34.0"})  # fmt: skip
    assert stage_times_ms(headers) == {"tokenizer": 1.25, "llm_first_chunk": 30.5, "llm_engine": 25, "first_token": 34}
