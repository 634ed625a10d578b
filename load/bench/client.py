"""One streaming request, timed on the client as `vllm bench serve` times it: completions and chat
here, speech in `tts.py`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
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
    # Speech: the PCM bytes of each content chunk (aligned with `content_times`) and their sample rate.
    chunk_bytes: list[int] = field(default_factory=list)
    sample_rate: int | None = None
    retry_after_s: float | None = None  # from a refusal's Retry-After header (seconds form)

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
    if prompt.priority:
        body["priority"] = prompt.priority
    if endpoint == "chat" and prompt.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": prompt.text}]
        parts += [{"type": "image_url", "image_url": {"url": url}} for url in prompt.images]
        body["messages"] = [{"role": "user", "content": parts}]
    elif endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


async def timed_post(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], record: RequestRecord,
    read: Callable[[httpx.Response], Awaitable[None]],
) -> None:  # fmt: skip
    """POSTs `body` and hands a 200 response to `read`; fills in the record's status, stage times,
    latency (until `read` is done) and, for another status or a transport error, its error."""
    try:
        async with client.stream("POST", url, json=body) as response:
            record.status = response.status_code
            record.stage_ms = stage_times_ms(response.headers)
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}"
                retry_after = response.headers.get("retry-after", "")
                record.retry_after_s = float(retry_after) if retry_after.isdigit() else None
                record.detail = (await response.aread()).decode(errors="replace")[:300]
            else:
                await read(response)
    except httpx.HTTPError as exc:  # a failed request is a result to count, not a reason to stop the run
        record.error = type(exc).__name__
        record.detail = str(exc)[:300]
    record.latency = time.perf_counter() - record.sent_at


async def send(
    client: httpx.AsyncClient, base_url: str, endpoint: Endpoint, model: str, prompt: Prompt
) -> RequestRecord:
    body = request_body(endpoint, model, prompt)
    record = RequestRecord(sent_at=time.perf_counter(), input_len=prompt.input_len)
    state = StreamState()

    async def read(response: httpx.Response) -> None:
        async for line in response.aiter_lines():
            state.feed(line, time.perf_counter() - record.sent_at)

    await timed_post(client, base_url + ENDPOINT_PATHS[endpoint], body, record, read)
    record.content_times = state.content_times
    record.prompt_tokens = state.prompt_tokens
    record.output_tokens = state.output_tokens
    if record.error is None and (failure := state.failure()) is not None:
        record.error = "stream"
        record.detail = failure
    return record
