"""Middlewares pick requests by the path the routes see, also behind a Serve `route_prefix`."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from serve_app.ingress.app import create_app
from serve_app.ingress.middleware.paths import GENERATION_PATHS, route_path
from serve_app.ingress.pipeline.services import Services


@pytest.mark.parametrize(
    ("path", "root_path", "expected"),
    [("/health", "", "/health"), ("/vision/health", "/vision", "/health"), ("/vision", "/vision", "/"),
     ("/other/health", "/vision", "/other/health")],
)  # fmt: skip
def test_route_path_drops_the_root_path(path: str, root_path: str, expected: str) -> None:
    assert route_path({"path": path, "root_path": root_path}) == expected


def test_metrics_and_auth_see_the_route_under_a_prefix(raw_args: dict[str, Any], services: Services) -> None:
    from serve_app.config import parse_app_args

    services.args = parse_app_args({**raw_args, "auth": {"api_keys": ["k"]}})
    client = TestClient(create_app(services), root_path="/vision")
    # `/vision/health` is the open `/health` route, not a route that needs a key.
    assert client.get("/vision/health").status_code in (200, 503)
    assert client.get("/vision/v1/models").status_code == 401
    metrics = client.get("/vision/metrics", headers={"Authorization": "Bearer k"}).text
    assert 'serve_graph_requests_total{endpoint="/v1/models",status="401"} 1.0' in metrics


def test_listing_voices_has_its_own_metrics_label_and_is_not_a_generation(client: TestClient) -> None:
    assert "/v1/audio/voices" not in GENERATION_PATHS  # admission does not count it
    assert client.get("/v1/audio/voices").status_code == 400  # a text model has no voices
    metrics = client.get("/metrics").text
    assert 'serve_graph_requests_total{endpoint="/v1/audio/voices",status="400"} 1.0' in metrics
