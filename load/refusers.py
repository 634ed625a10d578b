"""Servers that refuse every request and do nothing else: the floor under load.burst's refusal times.

A burst's refusal time is the server's, the kernel's and the load client's, all on the same cores. These
two refuse every request but `/health` and `/v1/models` with an OpenAI JSON 503 + Retry-After, as the
graph's admission does, so a burst against them measures what is left when the server does next to no work:
- `haproxy-refuser`: the HAProxy binary that Serve runs in front of the graph, answering from
  `refuser-haproxy.cfg`: no Python on the server side;
- `python-refuser`: `app` below under uvicorn. It reads the body, then answers: the least a Python
  server does before it can refuse by what the body asks.
Both are target kinds of the load tools (load/bench/targets.py):
`python -m load.burst --start haproxy-refuser --start python-refuser --requests 400 --max-tokens 256 --rounds 3`
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serve_app.errors import error_body

MODEL = "tiny-chat"
REFUSAL = json.dumps(error_body("Overloaded; retry later.", "ServiceUnavailableError", code=503)).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
HAPROXY_CONFIG = Path(__file__).with_name("refuser-haproxy.cfg")


def haproxy_env(port: int) -> dict[str, str]:
    """What `refuser-haproxy.cfg` reads from its environment."""
    return {"REFUSER_PORT": str(port), "REFUSER_BODY": REFUSAL.decode(), "REFUSER_MODELS": MODELS.decode()}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    status, body, extra = 503, REFUSAL, [(b"retry-after", b"1")]
    if scope["path"] == "/v1/models":
        status, body, extra = 200, MODELS, []
    elif scope["path"] == "/health":
        status, body, extra = 200, b"{}", []
    headers = [(b"content-type", b"application/json"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
