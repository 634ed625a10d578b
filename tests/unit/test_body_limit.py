"""serve_app/ingress/middleware/body_limit.py around a small echo app: declared and chunked bodies.

The image chat tests (test_chat_images.py) check the same bound through the whole ingress app.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.ingress.middleware.body_limit import BodySizeLimit

LIMIT = 1024
reached: list[str] = []  # the paths the echo app was called for


async def echo(request: Request) -> Response:
    reached.append(request.url.path)
    try:
        return Response(await request.body())
    except ClientDisconnect:  # how the limit ends the app's read after its 413; this answer is dropped
        return Response(b"read cut", status_code=499)


@pytest.fixture
def client() -> TestClient:
    reached.clear()
    return TestClient(BodySizeLimit(Starlette(routes=[Route("/", echo, methods=["POST"])]), LIMIT))


def chunks(total: int) -> Iterator[bytes]:
    """`total` bytes in pieces of at most 100, sent without a Content-Length."""
    for start in range(0, total, 100):
        yield b"x" * min(100, total - start)


def assert_refused(response: Any) -> None:
    assert response.status_code == 413
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("request_too_large", "BadRequestError")
    assert "limits.max_request_bytes" in error["message"]


@pytest.mark.parametrize("size", [0, LIMIT])
def test_a_body_up_to_the_limit_reaches_the_app_whole(client: TestClient, size: int) -> None:
    assert client.post("/", content=b"x" * size).content == b"x" * size
    assert client.post("/", content=chunks(size)).content == b"x" * size


def test_a_declared_length_over_the_limit_is_refused_before_the_app_reads(client: TestClient) -> None:
    assert_refused(client.post("/", content=b"x" * (LIMIT + 1)))
    assert reached == []


def test_a_chunked_body_is_refused_once_it_passes_the_limit(client: TestClient) -> None:
    assert_refused(client.post("/", content=chunks(LIMIT + 1)))
    assert client.post("/", content=b"ok").content == b"ok"  # and the next request is served
