"""serve_app/ingress/gate/admin.py: Serve's HAProxy admin socket and the health stamp (against a stand-in
socket here; against the real binary in test_gate_haproxy.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from serve_app.ingress.gate.admin import admin, admin_socket, publish_health
from serve_app.ingress.gate.haproxy import HEALTH_MAP


def test_the_socket_is_serves_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.serve._private import constants

    monkeypatch.setattr(constants, "RAY_SERVE_HAPROXY_SOCKET_PATH", "/run/hap/admin.sock")  # its setting, as read
    assert admin_socket("abc") == Path("/run/hap/abc/admin.sock")


@pytest.fixture
async def stand_in(tmp_path: Path) -> AsyncIterator[tuple[Path, list[str], list[str]]]:
    """A socket answering each line with the next of `answers` and closing, as HAProxy's admin socket does;
    `lines` is what it was sent."""
    lines: list[str] = []
    answers: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines.append((await reader.readline()).decode())
        writer.write(answers.pop(0).encode() if answers else b"\n")
        writer.close()

    socket = tmp_path / "admin.sock"
    server = await asyncio.start_unix_server(serve, str(socket))
    async with server:
        yield socket, lines, answers


async def test_a_line_gets_haproxys_answer(stand_in: tuple[Path, list[str], list[str]]) -> None:
    socket, lines, answers = stand_in
    answers.append("# table: gate\n")
    assert await admin(socket, "show table gate\n") == "# table: gate\n"
    assert lines == ["show table gate\n"]


async def test_the_stamp_sets_the_health_map(stand_in: tuple[Path, list[str], list[str]]) -> None:
    socket, lines, answers = stand_in
    (socket.parent / f"{HEALTH_MAP}.map").write_text("")
    await publish_health(socket, 1234)
    assert lines == [f"set map {socket.parent / HEALTH_MAP}.map until 1234\n"]
    answers.append("entry not found.\n")
    with pytest.raises(OSError, match="did not take the health stamp: 'entry not found"):
        await publish_health(socket, 0)


async def test_without_the_gate_the_stamp_writes_nothing(stand_in: tuple[Path, list[str], list[str]]) -> None:
    socket, lines, _ = stand_in
    await publish_health(socket, 1234)  # no health map beside the socket: not a gated HAProxy
    assert lines == []
