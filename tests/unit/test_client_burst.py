"""load/client_burst.py: concurrent completions through the `openai` client, counted by outcome."""

from __future__ import annotations

import httpx

from load.client_burst import markdown, measure
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.conftest import FakeLLM


async def test_every_request_of_a_burst_is_counted_by_outcome(services: Services, fake_llm: FakeLLM) -> None:
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport) as http:
        row = await measure("http://graph", None, n=12, max_tokens=1, words=8, http_client=http)
        refused = await measure("http://graph", "no-such-model", n=3, max_tokens=1, words=8, http_client=http)
    assert row["model"] == "tiny-chat" and row["outcomes"] == {"ok": 12} and row["latency_ms"]["n"] == 12
    assert refused["outcomes"] == {"http_404": 3}
    # Each request a prompt of its own: a repeated one would come from the engine's prefix cache.
    assert len({tuple(r.prompt_token_ids) for r in fake_llm.requests}) == 12


def test_the_page_shows_each_targets_outcomes() -> None:
    row = {"target": "graph", "model": "m", "requests": 3, "max_tokens": 1, "outcomes": {"ok": 2, "http_503": 1},
           "latency_ms": {"p50": 10.0, "p99": 20.0}, "wall_s": 1.5}  # fmt: skip
    table = markdown({"rows": [row]})
    assert "| graph | m | 3 | 1 | http_503: 1, ok: 2 | 10 / 20 | 1.5 |" in table
