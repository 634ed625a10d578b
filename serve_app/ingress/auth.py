"""Optional API keys: `Authorization: Bearer <key>` on every route but `/health` (pure ASGI).

Keys come from the config (`auth.api_keys`, pydantic SecretStr, so they never show in logs or
reprs) and from an environment variable of the ingress replica (`auth.api_keys_env`). Every key is
compared in constant time, so response timing says nothing about how much of a guess was right.
"""

from __future__ import annotations

import hmac
import os

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.config import AuthConfig
from serve_app.errors import AuthenticationError

# Probes (load balancers, Kubernetes, Ray Serve's own checks) carry no credentials.
OPEN_PATHS = frozenset({"/health"})


def load_keys(config: AuthConfig) -> list[bytes]:
    keys = [key.get_secret_value() for key in config.api_keys]
    if config.api_keys_env:
        keys += os.environ.get(config.api_keys_env, "").split(",")
    return [key.strip().encode() for key in keys if key.strip()]


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, keys: list[bytes]) -> None:
        self.app = app
        self.keys = keys

    def _allowed(self, header: bytes | None) -> bool:
        scheme, _, token = (header or b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        # All keys are compared, also after a match: the time taken does not depend on which matched.
        return sum(hmac.compare_digest(token.strip(), key) for key in self.keys) > 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if not self._allowed(dict(scope["headers"]).get(b"authorization")):
            error = AuthenticationError(
                "Incorrect or missing API key: send `Authorization: Bearer <key>`.", code="invalid_api_key"
            )
            await JSONResponse(error.to_dict(), status_code=error.status_code)(scope, receive, send)
            return
        await self.app(scope, receive, send)
