"""One streaming completion request, timed on the client as `vllm bench serve` times it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from load.bench.datasets import Prompt
from load.bench.sse import StreamState, stage_times_ms

Endpoint = Literal["completions", "chat"]
ENDPOINT_PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class RequestRecord:
    """One request. Times are seconds; `content_times` are relative to `sent_at` (perf_counter)."""

    sent_at: float
    input_len: int
    status: int | None = None
    error: str | None = None  # short kind, used to group failures ("HTTP 400", "ReadTimeout", ...)
    detail: str | None = None
    latency: float | None = None
    content_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    stage_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def request_body(endpoint: Endpoint, model: str, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": prompt.output_len,
        "ignore_eos": True,  # output length exactly max_tokens, whatever the model samples
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},  # exact token counts, not chunk counts
    }
    if endpoint == "chat" and prompt.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": prompt.text}]
        parts += [{"type": "image_url", "image_url": {"url": url}} for url in prompt.images]
        body["messages"] = [{"role": "user", "content": parts}]
    elif endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


async def send(
    client: httpx.AsyncClient, base_url: str, endpoint: Endpoint, model: str, prompt: Prompt
) -> RequestRecord:
    body = request_body(endpoint, model, prompt)
    record = RequestRecord(sent_at=time.perf_counter(), input_len=prompt.input_len)
    state = StreamState()
    try:
        async with client.stream("POST", base_url + ENDPOINT_PATHS[endpoint], json=body) as response:
            record.status = response.status_code
            record.stage_ms = stage_times_ms(response.headers)
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}"
                record.detail = (await response.aread()).decode(errors="replace")[:300]
            else:
                async for line in response.aiter_lines():
                    state.feed(line, time.perf_counter() - record.sent_at)
    except httpx.HTTPError as exc:  # a failed request is a result to count, not a reason to stop the run
        record.error = type(exc).__name__
        record.detail = str(exc)[:300]
    record.latency = time.perf_counter() - record.sent_at
    record.content_times = state.content_times
    record.prompt_tokens = state.prompt_tokens
    record.output_tokens = state.output_tokens
    if record.error is None and (failure := state.failure()) is not None:
        record.error = "stream"
        record.detail = failure
    return record
