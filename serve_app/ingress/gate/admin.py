"""Serve's HAProxy admin socket: where a node's is, one line of commands sent to it, and the graph's health
stamp. The gate's rates go through it too (`publisher.py`); the stamp is written by the graph's health app
(`graph_health.py`): while it is green and fresh, HAProxy answers a `GET /health` itself (`haproxy.py`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from serve_app.ingress.gate.haproxy import HEALTH_KEY, HEALTH_MAP

ANSWER_TIMEOUT_S = 5.0


def node_dir(setting: str, node_id: str) -> Path:
    """The directory in which Serve's HAProxy manager on node `node_id` puts the file that one of its
    `RAY_SERVE_HAPROXY_*` settings names (Serve 2.60's layout: the node's id as a directory before the
    file name)."""
    return Path(setting).parent / node_id


def admin_socket(node_id: str) -> Path:
    """Where Serve's HAProxy on node `node_id` listens for admin commands: Serve's own setting
    (`RAY_SERVE_HAPROXY_SOCKET_PATH`, its default included), as `deployments/stop.py` reads its others."""
    from ray.serve._private import constants as serve  # no public name for it in Serve 2.60

    setting = serve.RAY_SERVE_HAPROXY_SOCKET_PATH
    return node_dir(setting, node_id) / Path(setting).name


async def admin(socket: Path, line: str) -> str:
    """HAProxy's answer to one `line` of admin commands at `socket`."""
    reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        writer.write(line.encode())
        await writer.drain()
        # HAProxy closes the connection after the last command. Not `wait_for`: on Python 3.11 it can lose
        # the cancel that stops the health stamping loop (`graph_health.py`), which then never ends.
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            return (await reader.read()).decode()
    finally:
        writer.close()


async def publish_health(socket: Path, until_ms: int) -> None:
    """Tells the HAProxy at `socket` that the graph is green until `until_ms` (Unix time; 0: not green);
    nothing without the gate (no health map beside the socket)."""
    if not (socket.parent / f"{HEALTH_MAP}.map").exists():
        return
    answer = await admin(socket, f"set map {socket.parent / HEALTH_MAP}.map {HEALTH_KEY} {until_ms}\n")
    if answer.strip():
        raise OSError(f"HAProxy did not take the health stamp: {answer.strip()!r}")
