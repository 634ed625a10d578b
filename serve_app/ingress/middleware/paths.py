"""Route paths as the app's routes see them, for the pure-ASGI middlewares.

Behind Ray Serve an application at `route_prefix: /vision` gets `scope["path"] == "/vision/health"`
with `root_path == "/vision"` (uvicorn's convention); the routes match the path without the prefix,
and so must every middleware that picks requests by path.
"""

from __future__ import annotations

from starlette.types import Scope

# Text generation: what admission weighs by its body (the HAProxy gate and `EarlyAdmission`).
TEXT_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
GENERATION_PATHS = frozenset({*TEXT_GENERATION_PATHS, "/v1/audio/speech"})
KNOWN_PATHS = GENERATION_PATHS | {"/v1/models", "/v1/audio/voices", "/tokenize", "/detokenize", "/health", "/metrics"}


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path
