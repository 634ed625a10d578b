"""Optional API keys: `Authorization: Bearer <key>` on every route but `/health` (pure ASGI).

Keys come from the config (`auth.api_keys`, pydantic SecretStr, so they never show in logs or
reprs) and from an environment variable of the ingress replica (`auth.api_keys_env`). Every key is
compared in constant time, so response timing says nothing about how much of a guess was right.

With `auth.max_concurrent_per_key`, each key may have that many requests in progress on this
replica; the slot is held until the response's last byte (this is pure ASGI, so a stream holds it
for its whole length), and a request over the limit gets 429 with Retry-After.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.config import AuthConfig
from serve_app.errors import AuthenticationError, OpenAIError, RateLimitError, error_response
from serve_app.ingress.middleware.in_flight import InFlight
from serve_app.ingress.middleware.paths import route_path

# Probes (load balancers, Kubernetes, Ray Serve's own checks) carry no credentials.
OPEN_PATHS = frozenset({"/health"})


def load_keys(config: AuthConfig) -> list[bytes]:
    keys = [key.get_secret_value() for key in config.api_keys]
    if config.api_keys_env:
        keys += os.environ.get(config.api_keys_env, "").split(",")
    return [key.strip().encode() for key in keys if key.strip()]


class ApiKeyAuth:
    def __init__(
        self,
        app: ASGIApp,
        keys: list[bytes],
        max_concurrent_per_key: int | None = None,
        render: Callable[[OpenAIError], Response] = error_response,
    ) -> None:
        self.app = app
        self.keys = keys
        self.max_concurrent = max_concurrent_per_key
        # The app's renderer: a key over its limit gets the config's Retry-After (`admission.retry_after_s`).
        self.render = render
        # Requests in progress per key, by the key's position in `keys`: the keys themselves stay out of it.
        self.in_flight = InFlight()

    def _key_index(self, header: bytes | None) -> int | None:
        scheme, _, token = (header or b"").partition(b" ")
        token = token.strip()
        # All keys are compared, also after a match: the time taken does not depend on which matched.
        matches = [hmac.compare_digest(token, key) for key in self.keys]
        if scheme.lower() != b"bearer" or not any(matches):
            return None
        return matches.index(True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or route_path(scope) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        index = self._key_index(dict(scope["headers"]).get(b"authorization"))
        if index is None:
            message = "Incorrect or missing API key: send `Authorization: Bearer <key>`."
            await self.render(AuthenticationError(message, code="invalid_api_key"))(scope, receive, send)
            return
        if self.max_concurrent is not None and self.in_flight.count(index) >= self.max_concurrent:
            busy = RateLimitError(
                f"This API key already has {self.max_concurrent} requests in progress "
                "(auth.max_concurrent_per_key); retry when one has finished.",
                code="too_many_concurrent_requests",
            )
            await self.render(busy)(scope, receive, send)
            return
        await self.in_flight.run(self.app, scope, receive, send, key=index)
