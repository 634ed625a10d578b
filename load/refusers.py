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
  tokenizer in-process) under uvicorn, without Ray Serve or HAProxy. One request it admitted at start
  never ends, so its work admission refuses every generation request after it, as in a burst: what our
  code costs a refusal, apart from Serve's.
All are target kinds of the load tools (load/bench/targets.py):
`python -m load.burst --start haproxy-refuser --start python-refuser --requests 400 --max-tokens 256 --rounds 3`
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from serve_app.errors import OverloadedError, error_response
from serve_app.ingress.pipeline.work_admission import WorkGate
from serve_app.messages import GenerateRequest, GenerationChunk

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


class _Endless:
    """An llm stage whose every generation waits forever: the request admitted first stays in flight."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]  # never reached: makes this an async generator

    async def check_health(self) -> None:
        return None

    async def metrics_text(self) -> str:
        return ""


_HELD = json.dumps({"model": MODEL, "prompt": "hold", "max_tokens": 4000, "stream": True}).encode()
_HELD_SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
               "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
               "headers": [(b"content-type", b"application/json")], "client": None, "server": None}  # fmt: skip


class _FirstHeld:
    """`app`, into which the first HTTP request (the launcher's readiness check) slips a generation that
    never ends, before itself: every generation request after it is refused."""

    def __init__(self, app: Any, gate: WorkGate) -> None:
        self.app = app
        self.gate = gate
        self.held: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.held is None and scope["type"] == "http":
            messages = [{"type": "http.request", "body": _HELD, "more_body": False}]

            async def held_receive() -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await asyncio.Event().wait()
                raise AssertionError("unreachable")

            async def discard(_: dict[str, Any]) -> None:
                return None

            self.held = asyncio.get_running_loop().create_task(self.app(dict(_HELD_SCOPE), held_receive, discard))
            while not self.gate.live:  # admitted before this request goes on
                if self.held.done():
                    raise RuntimeError("the held generation ended before it was admitted") from self.held.exception()
                await asyncio.sleep(0.01)
        await self.app(scope, receive, send)


def ingress_app(config: str = "configs/cpu-tiny.yaml") -> Any:
    """The ingress's app for tiny-chat (uvicorn's `--factory`), with `max_wait_s` 1 s: behind the held
    generation (4,000 tokens, ~5 s at the config's rates) every generation request is refused."""
    from load.serve_config import load_in_process
    from serve_app.ingress.app import create_app
    from serve_app.ingress.pipeline.services import Services
    from serve_app.stages.local import LocalTokenizer
    from serve_app.stages.tokenizer import TokenizerStage

    args = load_in_process(config, MODEL)
    args = args.model_copy(update={"admission": args.admission.model_copy(update={"max_wait_s": 1.0})})
    services = Services.create(args, LocalTokenizer(TokenizerStage.from_args(args)), _Endless())
    assert services.work is not None  # the default config admits tiny-chat by work
    return _FirstHeld(create_app(services), services.work)
