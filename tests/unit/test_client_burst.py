"""load/client_burst.py: concurrent completions through the `openai` client, counted by outcome."""

from __future__ import annotations

import httpx

from load.client_burst import measure
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline import Services


async def test_every_request_of_a_burst_is_counted_by_outcome(services: Services) -> None:
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport) as http:
        row = await measure("http://graph", None, n=12, max_tokens=1, words=8, http_client=http)
        refused = await measure("http://graph", "no-such-model", n=3, max_tokens=1, words=8, http_client=http)
    assert row["model"] == "tiny-chat" and row["outcomes"] == {"ok": 12} and row["latency_ms"]["n"] == 12
    assert refused["outcomes"] == {"http_404": 3}
