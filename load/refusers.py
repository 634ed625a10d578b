"""Servers that refuse every request and do nothing else: the floor under load.burst's refusal times.

A burst's refusal time is spent in the server, the kernel and the load client, all on the same cores.
These two answer every request but `/health` and `/v1/models` with the graph's own work-admission refusal
(`REFUSAL`: its OpenAI JSON 503 and Retry-After, built as the ingress builds it), so a burst against them
measures what is left when the server does next to no work:
- `haproxy-refuser`: the HAProxy binary that Serve runs in front of the graph, answering from
  `refuser-haproxy.cfg` without reading the body: no Python on the server side;
- `python-refuser`: `app` below under uvicorn. It reads the body first, as any server that refuses by
  what the body asks must.
Both are target kinds of the load tools (load/bench/targets.py):
`python -m load.burst --start haproxy-refuser --start python-refuser --requests 400 --max-tokens 256 --rounds 3`
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serve_app.errors import OverloadedError, error_response

MODEL = "tiny-chat"
# What the ingress answers when the engine's expected wait is too long (work_admission.py), with the
# default `admission:` settings.
REFUSAL = error_response(OverloadedError(
    "The engine has about 9.8 s of admitted work ahead of this request, which needs about 0.4 s more; "
    "more than the 10.0 s it may wait. Retry later.", code="overloaded", reason="expected_wait",
))  # fmt: skip
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
HAPROXY_CONFIG = Path(__file__).with_name("refuser-haproxy.cfg")


def haproxy_env(port: int) -> dict[str, str]:
    """What `refuser-haproxy.cfg` reads from its environment."""
    return {"REFUSER_PORT": str(port), "REFUSER_STATUS": str(REFUSAL.status_code),
            "REFUSER_BODY": bytes(REFUSAL.body).decode(), "REFUSER_RETRY_AFTER": REFUSAL.headers["retry-after"],
            "REFUSER_MODELS": MODELS.decode()}  # fmt: skip


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":  # uvicorn's lifespan messages: nothing to start or stop
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if scope["path"] in ("/v1/models", "/health"):
        body = MODELS if scope["path"] == "/v1/models" else b"{}"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    else:
        await REFUSAL(scope, receive, send)
