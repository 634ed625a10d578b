"""Servers that refuse every request and do nothing else: the floor under load.burst's refusal times.

A burst's refusal time is spent in the server, the kernel and the load client, all on the same cores.
These two answer every request but `/health` and `/v1/models` with the graph's own work-admission refusal
(`REFUSAL`: its OpenAI JSON 503 and Retry-After, built as the ingress builds it), so a burst against them
measures what is left when the server does next to no work:
- `haproxy-refuser`: the HAProxy binary that Serve runs in front of the graph, answering from
  `refuser-haproxy.cfg` without reading the body: no Python on the server side;
- `python-refuser`: `app` below under uvicorn. It reads the body first, as any server that refuses by
  what the body asks must;
- `ingress-refuser`: the graph's own ingress app (`ingress_app` below: tiny-chat of the default config, its
  tokenizer in-process) under uvicorn, without Ray Serve or HAProxy. It holds one work ticket for good, so
  its work admission refuses every generation request, as in a burst: what our code costs a refusal,
  apart from Serve's.
All are target kinds of the load tools (load/bench/targets.py):
`python -m load.burst --start haproxy-refuser --start python-refuser --requests 400 --max-tokens 256 --rounds 3`
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from load.graph_launcher import ray_setting
from serve_app.errors import error_response
from serve_app.ingress.pipeline.work_admission import expected_wait_error
from serve_app.messages import GenerateRequest, GenerationChunk

MODEL = "tiny-chat"
# What the ingress answers when the engine's expected wait is too long (work_admission.py), with the
# default `admission:` settings and tiny-chat's 15 s `max_wait_s`.
REFUSAL = error_response(expected_wait_error(14.8, 0.4, 15.0))
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
HAPROXY_CONFIG = Path(__file__).with_name("refuser-haproxy.cfg")


def haproxy_env(port: int) -> dict[str, str]:
    """What `refuser-haproxy.cfg` reads from its environment."""
    return {"REFUSER_PORT": str(port), "REFUSER_STATUS": str(REFUSAL.status_code),
            "REFUSER_BODY": bytes(REFUSAL.body).decode(), "REFUSER_RETRY_AFTER": REFUSAL.headers["retry-after"],
            "REFUSER_MODELS": MODELS.decode(),
            "REFUSER_NBTHREAD": ray_setting("RAY_SERVE_HAPROXY_NBTHREAD")}  # fmt: skip


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


class _Endless:
    """An llm stage that is never asked to generate: the held ticket has every request refused first."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]  # never reached: makes this an async generator

    async def check_health(self) -> None:
        return None

    async def metrics_text(self) -> str:
        return ""


def ingress_app() -> Any:
    """The ingress's app for the default config's tiny-chat (uvicorn's `--factory`), with `max_wait_s` 1 s and
    a work ticket held for good (a 4,000-token generation, ~5 s at the config's rates): every generation
    request is refused."""
    from load.serve_config import DEFAULT_CONFIG, load_in_process
    from serve_app.ingress.app import create_app
    from serve_app.ingress.pipeline.services import Services
    from serve_app.stages.tokenizer import TokenizerStage

    args = load_in_process(DEFAULT_CONFIG, MODEL)
    args = args.model_copy(update={"admission": args.admission.model_copy(update={"max_wait_s": 1.0})})
    services = Services.create(args, TokenizerStage.from_args(args), _Endless())
    assert services.work is not None  # the default config admits tiny-chat by work
    fastapi_app = create_app(services)
    fastapi_app.state.held = services.work.admit(prompt_tokens=1, max_tokens=4000)
    return fastapi_app
