"""One streamed request against the real ingress app (in process, FakeLLM): parsing, usage, errors."""

from __future__ import annotations

import httpx
import pytest

from load.bench.client import Endpoint, send
from load.bench.datasets import Prompt
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.conftest import MAX_MODEL_LEN, MODEL_NAME


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_streamed_request(services: Services, endpoint: Endpoint) -> None:
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport) as client:
        record = await send(client, "http://app", endpoint, MODEL_NAME, Prompt(" the the the", 3, 5))
    assert record.ok, record.detail
    assert record.status == 200
    assert record.output_tokens == 5
    assert record.prompt_tokens is not None and record.prompt_tokens >= 3
    assert len(record.content_times) == 5  # FakeLLM: one token per chunk
    assert record.latency is not None and record.latency >= record.content_times[-1]
    assert set(record.stage_ms) == {"tokenizer", "llm_first_chunk", "first_token"}


async def test_rejected_request(services: Services) -> None:
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport) as client:
        record = await send(client, "http://app", "chat", MODEL_NAME, Prompt(" the" * MAX_MODEL_LEN, MAX_MODEL_LEN, 5))
    assert (record.ok, record.status, record.error) == (False, 400, "HTTP 400")
    assert record.detail is not None and "maximum context length" in record.detail


async def test_connection_failure_is_a_failed_record() -> None:
    async with httpx.AsyncClient() as client:
        record = await send(client, "http://127.0.0.1:9", "completions", MODEL_NAME, Prompt(" the", 1, 1))
    assert (record.ok, record.status, record.error) == (False, None, "ConnectError")
