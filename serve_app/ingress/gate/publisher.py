"""The ingress's side of the HAProxy gate (`haproxy.py`): every second it writes each model's rates into
the maps of its node's HAProxy, through Serve's admin socket, so the gate weighs requests as the
ingress's work admission does (`WorkGate.gate_rates`, learned speed included); and it reads back how
many requests the gate refused, into the model's `serve_graph_rejections_total{stage="gate"}`.

A reload of HAProxy (Serve reloads it when replicas come and go) starts from the empty map files, which
gate nothing, until the next second's writes. Without the gate (HAProxy not started through
`serve-graph-haproxy`: no map files beside the socket) nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from serve_app.ingress.gate.haproxy import MAPS, TABLE
from serve_app.ingress.pipeline.services import Services

logger = logging.getLogger(__name__)

PERIOD_S = 1.0
# A line of `show table`: an entry's key (model/slot) and its refusals so far.
_ENTRY = re.compile(r"key=(\S+) .*gpc0=(\d+)")


def admin_socket(node_id: str) -> Path:
    """Where Serve's HAProxy on node `node_id` listens for admin commands (Serve 2.60's layout: its
    `RAY_SERVE_HAPROXY_SOCKET_PATH` with the node's id as a directory before the file name)."""
    default = os.environ.get("RAY_SERVE_HAPROXY_SOCKET_PATH", "/tmp/haproxy-serve/admin.sock")
    path = Path(default)
    return path.parent / node_id / path.name


def map_values(services: Services) -> dict[str, int] | None:
    """The gate's map values for one model (nanoseconds, as the rules compute in integers), or None for
    a model admitted by count only."""
    if services.work is None:
        return None
    per_char_s, per_token_s, wait_s = services.work.gate_rates()
    admission = services.args.admission
    return {"wait_ns": int(wait_s * 1e9), "char_ns": max(1, int(per_char_s * 1e9)),
            "token_ns": max(1, int(per_token_s * 1e9)), "status": admission.status_code,
            "retry_after": admission.retry_after_s}  # fmt: skip


def commands(gate_dir: Path, models: Iterable[Services]) -> str:
    """One line of admin commands setting every model's entries (`del` then `add`: `set` cannot add a key)."""
    out = []
    for services in models:
        values = map_values(services)
        if values is None:
            continue
        name = services.args.model.name
        for map_name in MAPS:
            path = gate_dir / f"{map_name}.map"
            out += [f"del map {path} {name}", f"add map {path} {name} {values[map_name]}"]
    return "; ".join([*out, f"show table {TABLE}"]) + "\n"


class RefusalCounts:
    """The gate's refusals per model from `show table`, turned into increments of the model's counter
    (HAProxy's counters start again from zero when it reloads)."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def new(self, table: str) -> dict[str, int]:
        """Refusals per model since the last call: `table` is the output of `show table`."""
        now: dict[str, int] = {}
        for line in table.splitlines():
            if entry := _ENTRY.search(line):
                now[entry.group(1)] = int(entry.group(2))
        added: dict[str, int] = {}
        for key, count in now.items():
            before = self._seen.get(key, 0)
            grown = count - before if count >= before else count
            if grown:
                model = key.rsplit("/", 1)[0]
                added[model] = added.get(model, 0) + grown
        self._seen = now
        return added


async def publish(socket: Path, models: Iterable[Services]) -> str:
    """Writes every model's rates into the maps beside `socket` once; returns HAProxy's answer."""
    reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        writer.write(commands(socket.parent, models).encode())
        await writer.drain()
        return (await reader.read()).decode()  # HAProxy closes the connection after the last command
    finally:
        writer.close()


async def publish_forever(socket: Path, models: list[Services]) -> None:
    """`publish` every `PERIOD_S` while the gate's maps exist beside `socket`, counting its refusals."""
    if not (socket.parent / f"{MAPS[0]}.map").exists():
        logger.info("no HAProxy admission gate at %s: refusals are the ingress's only", socket.parent)
        return
    by_name = {services.args.model.name: services for services in models}
    refusals = RefusalCounts()
    while True:
        try:
            answer = await publish(socket, models)
        except OSError as exc:  # HAProxy reloading, or gone
            logger.debug("gate maps not written: %s", exc)
        else:
            for name, count in refusals.new(answer).items():
                if name in by_name:
                    by_name[name].metrics.rejections.labels("gate", "expected_wait").inc(count)
        await asyncio.sleep(PERIOD_S)
