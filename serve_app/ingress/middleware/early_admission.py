"""Admission by work before FastAPI: the excess of a burst is refused in microseconds, in arrival order.

Weighed in the request path (after FastAPI parsed and validated the body), the 333 refusals of a burst
of 400 simultaneous 256-token generations came 1.8 s (p50) to 3.2 s (p99) after their requests: each
waited on the ingress's one event loop behind the parsing, validation and stage calls of every request
that arrived before it. Here a chat or text completion is weighed from its raw JSON as soon as its body
is in (`work_admission.py`: the prompt's characters, `max_tokens`, `n`), before any parsing of the
application's, and refused at once or given its ticket. An admitted request then yields once, so every
request already received is weighed before any of them goes on: a refusal never waits behind the
requests admitted ahead of it.

The ticket goes with the request (a context variable, the same task runs the route); the request path
takes it for its first prompt instead of weighing again, and resizes it once tokenized. Whatever the
route does (serves, fails validation, never starts its stream), the ticket is released when the
response is over. A body that is not a JSON object of the expected shape is left to the route, which
answers the 4xx and weighs nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.config import LimitsConfig
from serve_app.errors import BadRequestError, OpenAIError, OverloadedError
from serve_app.ingress.completions.protocol import DEFAULT_MAX_TOKENS
from serve_app.ingress.middleware.paths import TEXT_GENERATION_PATHS, route_path
from serve_app.ingress.pipeline.deadline import HEADER, arrival, request_deadline
from serve_app.ingress.pipeline.inline_tokenizer import content_chars
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.pipeline.work_admission import WorkTicket, admit_prompt

_TIMEOUT_HEADER = HEADER.lower().encode()


@dataclass
class EarlyTicket:
    """A ticket taken before parsing, waiting for the request path (`take_early_ticket`)."""

    ticket: WorkTicket
    taken: bool = False


_early: ContextVar[EarlyTicket | None] = ContextVar("early_ticket", default=None)


def take_early_ticket() -> WorkTicket | None:
    """The ticket this request was admitted with before parsing, once (a request's later prompts weigh
    themselves); None when it had none."""
    early = _early.get()
    if early is None or early.taken:
        return None
    early.taken = True
    return early.ticket


@dataclass(frozen=True)
class Weight:
    """A generation request as the gate weighs it: prompt characters (or exact tokens) and tokens to generate."""

    prompt_chars: int
    prompt_tokens: int | None
    max_tokens: int | None
    n: int
    truncating: bool  # `truncate_prompt_tokens` set: a prompt longer than the context is cut, not refused
    param: str  # where the prompt is: "messages" or "prompt"


def weigh(path: str, body: dict[str, Any]) -> Weight | None:
    """The first prompt of a chat or completion body, or None when the body is not of a shape the route
    accepts (the route will say what is wrong)."""
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:  # absent or null: `max_tokens`, as the chat route reads it
        max_tokens = body.get("max_tokens")
    if max_tokens is None and path == "/v1/completions":
        max_tokens = DEFAULT_MAX_TOKENS  # its route's budget when unset or null
    n = body.get("n")
    n = 1 if n is None else n  # absent or null: the route's default
    truncating = body.get("truncate_prompt_tokens") is not None
    if not (max_tokens is None or _is_positive_int(max_tokens)) or not _is_positive_int(n):
        # The route's 400 (weighed here, it could be refused as an overload instead), or max_tokens 0 with
        # echo, which the route weighs at the one token it generates.
        return None
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        chars = sum(content_chars(m.get("content")) for m in messages if isinstance(m, dict))
        return Weight(chars, None, max_tokens, n, truncating, "messages")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # several prompts: the first here, the others in the request path
    if isinstance(prompt, str):
        return Weight(len(prompt), None, max_tokens, n, truncating, "prompt")
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return Weight(0, len(prompt), max_tokens, n, truncating, "prompt")
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_int(value: Any) -> bool:
    return _is_int(value) and value >= 1


class EarlyAdmission:
    """Pure ASGI, inside the body-size limit (the body it buffers is bounded) and the key check."""

    def __init__(
        self,
        app: ASGIApp,
        lookup: Callable[[str | None], Services | None],
        render: Callable[[OpenAIError, Services], Response],
    ) -> None:
        """`lookup`: the model a raw body names (`ModelRouter.lookup`: None for an unknown model, the route's
        404); `render`: a refusal, as that model answers it."""
        self.app = app
        self.lookup = lookup
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope) if scope["type"] == "http" else ""
        if path not in TEXT_GENERATION_PATHS or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        replay = _replay(messages, receive)
        ticket = self._weigh(scope, path, b"".join(m.get("body", b"") for m in messages))
        if isinstance(ticket, Response):
            await ticket(scope, replay, send)
            return
        if ticket is None:
            await self.app(scope, replay, send)
            return
        token = _early.set(EarlyTicket(ticket))
        try:
            await asyncio.sleep(0)  # let the rest of a burst be weighed first
            await self.app(scope, replay, send)
        finally:
            ticket.release()
            _early.reset(token)

    def _weigh(self, scope: Scope, path: str, raw: bytes) -> WorkTicket | Response | None:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested too deep: the route's 400
            return None
        if not isinstance(body, dict):
            return None
        model = body.get("model")
        services = self.lookup(model if isinstance(model, str) else None)
        weight = weigh(path, body)
        if services is None or services.work is None or weight is None:
            return None
        if weight.n > services.args.limits.max_n or (weight.max_tokens or 0) > services.args.max_budget:
            return None  # the route's 400 names `n` or the budget; weighed here, it could be refused as an overload
        deadline_s = _deadline_s(services.args.limits, scope)
        if deadline_s is not None and deadline_s <= 0:
            return None  # a passed deadline is the route's 504, not an overload
        try:
            return admit_prompt(
                services.work, services.args, weight.prompt_chars, weight.prompt_tokens,
                max_tokens=weight.max_tokens, n=weight.n, deadline_s=deadline_s,
                truncating=weight.truncating, param=weight.param,
            )  # fmt: skip
        except (OverloadedError, BadRequestError) as error:  # an overload, or a prompt too long for the context
            return self.render(error, services)


def _deadline_s(limits: LimitsConfig, scope: Scope) -> float | None:
    header = next((v for k, v in scope["headers"] if k == _TIMEOUT_HEADER), None)
    try:
        deadline = request_deadline(limits, None if header is None else header.decode("latin-1"), arrival(scope))
    except OpenAIError:
        return 0.0  # a bad header: the route answers its 400
    return None if deadline is None else deadline.remaining()


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """`receive` that first gives back the messages already read."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
