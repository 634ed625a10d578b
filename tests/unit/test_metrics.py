"""The ingress's metrics (serve_app/ingress/observability/metrics.py) as requests fill them: TTFT split into engine and
framework time (histogram and headers), and the per-stage in-flight gauge."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from serve_app.ingress.pipeline.services import Services
from serve_app.messages import GenerateRequest, GenerationChunk
from tests.unit.conftest import MODEL_NAME, FakeLLM

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
ENGINE_TTFT_S = 0.25


class TimedLLM(FakeLLM):
    """FakeLLM whose first chunk reports the engine's time to first output, as the LLM stage does."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        first = True
        async for chunk in super().generate(request):
            yield replace(chunk, engine_ttft_s=ENGINE_TTFT_S) if first else chunk
            first = False


def sample(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[-1])


@pytest.mark.parametrize("stream", [False, True])
def test_ttft_is_split_into_engine_and_framework_time(client: TestClient, services: Services, stream: bool) -> None:
    services.llm = TimedLLM()
    start = time.perf_counter()
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    elapsed_ms = (time.perf_counter() - start) * 1000
    assert response.status_code == 200
    assert response.headers["x-llm-engine-time"] == f"{ENGINE_TTFT_S * 1000:.3f}"
    # The fake answers at once and reports 250 ms it never spent: the first-token time is the time the
    # ingress really took, within the request's, and adds nothing of the reported engine time.
    assert 0 < float(response.headers["x-first-token-time"]) <= elapsed_ms
    metrics = client.get("/metrics").text
    for part in ("total", "engine", "framework"):
        assert sample(metrics, f'serve_graph_ttft_seconds_count{{part="{part}"}}') == 1
    assert sample(metrics, 'serve_graph_ttft_seconds_sum{part="engine"}') == ENGINE_TTFT_S
    total, framework = (sample(metrics, f'serve_graph_ttft_seconds_sum{{part="{p}"}}') for p in ("total", "framework"))
    assert framework == pytest.approx(total - ENGINE_TTFT_S)
    assert sample(metrics, 'serve_graph_stage_seconds_count{stage="llm_engine"}') == 1


def test_without_an_engine_time_only_the_total_is_observed(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json=CHAT)
    assert "x-llm-engine-time" not in response.headers and "x-first-token-time" in response.headers
    metrics = client.get("/metrics").text
    assert sample(metrics, 'serve_graph_ttft_seconds_count{part="total"}') == 1
    assert 'serve_graph_ttft_seconds_count{part="engine"}' not in metrics


async def test_stage_in_flight_counts_open_calls_until_they_end(services: Services) -> None:
    from serve_app.ingress.completions.protocol import CompletionRequest
    from serve_app.ingress.completions.serving import create_completion

    def in_flight(stage: str) -> float | None:
        return services.metrics.registry.get_sample_value("serve_graph_stage_in_flight", {"stage": stage})

    request = CompletionRequest.model_validate({"model": MODEL_NAME, "prompt": ["a", "b"], "stream": True})
    response = await create_completion(services, request)
    assert (in_flight("tokenizer"), in_flight("llm")) == (0, 2)  # two prompts: two streams open
    body = response.body_iterator
    await anext(body)
    await body.aclose()  # the client went away
    await asyncio.sleep(0)
    assert in_flight("llm") == 0
    response = await create_completion(services, request)
    async for _ in response.body_iterator:
        pass
    assert in_flight("llm") == 0
