"""The Python side of the HAProxy gate (`haproxy.py`). Every second the ingress writes each model's rates
into the maps of its node's HAProxy, through Serve's admin socket, so the gate weighs requests as the
ingress's work admission does (`WorkGate.gate_rates`, learned speed included); and it reads back how
many requests the gate refused, into the model's `serve_graph_rejections_total{stage="gate"}`.

It also writes the map files, so that a reload of HAProxy (Serve reloads it when replicas come and go)
starts from rates at most `FILES_PERIOD_S` old rather than from none (the next second's publishing
brings it up to date). With several ingress replicas on a node one of them publishes (a lock on the
gate's directory), so refusals are counted once; only the application at route `/` publishes. Without
the gate (HAProxy not started through `serve-graph-haproxy`: no map files beside the socket) nothing is
written.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import IO

from serve_app.ingress.gate.admin import admin
from serve_app.ingress.gate.haproxy import MAPS, TABLE
from serve_app.ingress.pipeline.services import Services

logger = logging.getLogger(__name__)

PERIOD_S = 1.0
# How often, at most, the map files are rewritten: under load the learned rates change every second, and
# a rewrite each second took ~2 % of the ingress's Python (py-spy at concurrency 32).
FILES_PERIOD_S = 10.0
# A line of `show table`: an entry's key (model/slot) and its refusals so far.
_ENTRY = re.compile(r"key=(\S+) .*gpc0=(\d+)")
# A name the admin socket's command line can carry as one word.
_NAME = re.compile(r"[^\s;#\\]+")
# The answer to `prepare map`.
_VERSION = re.compile(r"New version created: (\d+)")


def map_values(services: Services) -> dict[str, int] | None:
    """The gate's map values for one model (nanoseconds, as the rules compute in integers), or None for
    a model admitted by count only, or whose name the admin socket cannot carry."""
    name = services.args.model.name
    if services.work is None or not _NAME.fullmatch(name):
        return None
    per_char_s, per_token_s, wait_s = services.work.gate_rates()
    args = services.args
    return {"wait_ns": int(wait_s * 1e9), "char_ns": max(1, int(per_char_s * 1e9)),
            "token_ns": max(1, int(per_token_s * 1e9)), "max_tokens": args.max_budget, "max_n": args.limits.max_n,
            "status": args.admission.status_code, "retry_after": args.admission.retry_after_s}  # fmt: skip


def entries(models: Iterable[Services]) -> dict[str, dict[str, int]]:
    """Every gated model's values, by map name and then model name."""
    by_map: dict[str, dict[str, int]] = {name: {} for name in MAPS}
    for services in models:
        values = map_values(services)
        for map_name, value in (values or {}).items():
            by_map[map_name][services.args.model.name] = value
    return by_map


def prepare(gate_dir: Path, names: Iterable[str]) -> str:
    """A line of admin commands opening a new, empty version of each named map."""
    return "; ".join(f"prepare map {gate_dir / name}.map" for name in names) + "\n"


def commands(gate_dir: Path, by_map: dict[str, dict[str, int]], versions: dict[str, str]) -> str:
    """One line of admin commands filling each map's prepared version (`versions`, by map name) and
    committing it, which swaps the whole map at once (a request never finds a model's entry missing, as
    between a `del` and an `add`), then reading the refusals."""
    out = []
    for map_name, values in by_map.items():
        path, version = gate_dir / f"{map_name}.map", versions[map_name]
        out += [f"add map @{version} {path} {name} {value}" for name, value in values.items()]
        out.append(f"commit map @{version} {path}")
    return "; ".join([*out, f"show table {TABLE}"]) + "\n"


def write_maps(gate_dir: Path, by_map: dict[str, dict[str, int]]) -> None:
    """The same entries into the map files, which HAProxy reads when it (re)starts."""
    for map_name, values in by_map.items():
        partial = gate_dir / f"{map_name}.map.new"
        partial.write_text("".join(f"{name} {value}\n" for name, value in values.items()))
        partial.replace(gate_dir / f"{map_name}.map")


class RefusalCounts:
    """The gate's refusals per model from `show table`, turned into increments of the model's counter
    (HAProxy's counters start again from zero when it reloads)."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def new(self, table: str) -> dict[str, int]:
        """Refusals per model since the last call: `table` is the output of `show table`."""
        now = {entry.group(1): int(entry.group(2)) for line in table.splitlines() if (entry := _ENTRY.search(line))}
        added: dict[str, int] = {}
        for key, count in now.items():
            before = self._seen.get(key, 0)
            grown = count - before if count >= before else count
            if grown:
                model = key.rsplit("/", 1)[0]
                added[model] = added.get(model, 0) + grown
        self._seen = now
        return added


async def publish(socket: Path, by_map: dict[str, dict[str, int]]) -> str:
    """Writes `by_map` into the maps of the HAProxy at `socket` once; returns its answer."""
    answer = await admin(socket, prepare(socket.parent, by_map))
    versions = dict(zip(by_map, _VERSION.findall(answer), strict=False))
    if len(versions) != len(by_map):
        raise OSError(f"HAProxy prepared {len(versions)} of {len(by_map)} maps: {answer.strip()!r}")
    answer = await admin(socket, commands(socket.parent, by_map, versions))
    refused = answer.split("# table:")[0].strip()  # `add` and `commit` answer nothing when they succeed
    if refused:
        raise OSError(f"HAProxy did not take the gate's maps: {refused[:300]!r}")
    return answer


def _node_lock(gate_dir: Path) -> IO[str] | None:
    """This process's hold on publishing for the node, or None while another ingress replica has it."""
    lock = (gate_dir / "publisher.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


class Publisher:
    """The node's publishing, one step a second (`publish_forever`). `at_root` tells whether this ingress's
    application is at route `/`: the gate weighs only `/v1/...` paths, so another application's rates
    would gate the wrong requests (its own are admitted by its ingress alone)."""

    def __init__(self, socket: Path, models: list[Services], at_root: Callable[[], Awaitable[bool]]) -> None:
        self._socket = socket
        self._models = models
        self._at_root = at_root
        self._root: bool | None = None  # asked until answered; an application's route is fixed
        self._by_name = {services.args.model.name: services for services in models}
        self._refusals = RefusalCounts()
        self._lock: IO[str] | None = None
        self._state = ""  # what was last logged: each change of state is logged once
        self._written: dict[str, dict[str, int]] | None = None  # what the map files hold
        self._written_at = -FILES_PERIOD_S  # time.monotonic() of that

    def _log(self, state: str, message: str, *args: object) -> None:
        if state != self._state:
            logger.info(message, *args)
        self._state = state

    async def step(self) -> None:
        gate_dir = self._socket.parent
        if not (gate_dir / f"{MAPS[0]}.map").exists():
            return self._log("absent", "no HAProxy admission gate at %s (yet): refusals are the ingress's", gate_dir)
        if self._root is None:
            self._root = await self._at_root()
        if not self._root:
            return self._log("prefix", "this application is not at route `/`: the gate is not its to fill")
        self._lock = self._lock or _node_lock(gate_dir)
        if self._lock is None:
            return self._log("other", "another ingress replica publishes the gate's rates at %s", gate_dir)
        by_map = entries(self._models)
        if by_map != self._written and time.monotonic() - self._written_at >= FILES_PERIOD_S:
            write_maps(gate_dir, by_map)
            self._written, self._written_at = by_map, time.monotonic()
        try:
            answer = await publish(self._socket, by_map)
        except (OSError, TimeoutError) as exc:  # HAProxy reloading, or gone: the next second tells
            return self._log("failing", "publishing to the gate's HAProxy at %s failed: %r", self._socket, exc)
        self._log("publishing", "publishing the gate's rates at %s", gate_dir)
        for name, count in self._refusals.new(answer).items():
            if name in self._by_name:
                self._by_name[name].metrics.rejections.labels("gate", "expected_wait").inc(count)


async def publish_forever(socket: Path, models: list[Services], at_root: Callable[[], Awaitable[bool]]) -> None:
    """`Publisher.step` every `PERIOD_S`; a step that fails is logged, and the next one tries again."""
    publisher = Publisher(socket, models, at_root)
    while True:
        try:
            await publisher.step()
        except Exception:
            logger.exception("publishing the gate's rates failed")
        await asyncio.sleep(PERIOD_S)
