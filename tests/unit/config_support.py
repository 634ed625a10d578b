"""The one check that a config's `deployments:` fit what the builder binds (tests of configs/ and of
load/serve_config.py's output)."""

from __future__ import annotations

from typing import Any

from ray.serve._private.build_app import build_app as serve_build

from deployments.graph import build_app


def assert_deployments_are_the_builders(app: dict[str, Any]) -> list[str]:
    """Serve applies a graph application's `deployments:` by name to what its builder binds: the same
    names, exactly. Returns them, sorted."""
    built = sorted(d.name for d in serve_build(build_app(app["args"]), name=app["name"]).deployments)
    assert sorted(d["name"] for d in app["deployments"]) == built
    return built
