"""`/health` latency probes, run beside the load: a stalled event loop shows here first."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import httpx

from load.stats import percentile, summary_ms


@dataclass(frozen=True)
class HealthSample:
    sent_at: float  # perf_counter
    latency: float  # seconds until answered, or until the failure
    status: int | None
    error: str | None = None
    # A probe of another server sent at the same instant by the same process (load.health_probe's floor):
    # what the two share (this process waking, the machine's load) cancels in the difference.
    beside: HealthSample | None = None


async def probe(client: httpx.AsyncClient, base_url: str, stop: asyncio.Event, interval_s: float,
                beside: str | None = None) -> list[HealthSample]:  # fmt: skip
    """Probes started every `interval_s`, one at a time, until `stop` is set; with `beside`, a probe of that
    server's `/health` goes at the same instant as each (`HealthSample.beside`).

    A probe that outlasts the interval delays the next one instead of piling up: the samples then
    thin out, and the long one shows in the maximum.
    """
    samples: list[HealthSample] = []
    next_at = time.perf_counter()
    while not stop.is_set():
        if beside is None:
            samples.append(await _probe_once(client, base_url))
        else:
            sample, other = await asyncio.gather(_probe_once(client, base_url), _probe_once(client, beside))
            samples.append(dataclasses.replace(sample, beside=other))
        next_at = max(next_at + interval_s, time.perf_counter())
        await asyncio.sleep(next_at - time.perf_counter())
    return samples


async def _probe_once(client: httpx.AsyncClient, base_url: str) -> HealthSample:
    sent_at = time.perf_counter()
    try:
        response = await client.get(f"{base_url}/health")
        return HealthSample(sent_at, time.perf_counter() - sent_at, response.status_code)
    except httpx.HTTPError as exc:  # an unanswered probe is the very thing being measured
        return HealthSample(sent_at, time.perf_counter() - sent_at, None, type(exc).__name__)


PROCESS_NAME = "health-probe"


class ProbeProcess:
    """`probe` run in a process of its own, from entering the `with` until `stop()`, which returns its
    samples (`sent_at` on the same monotonic clock as this process's perf_counter).

    A load client that saturates its own event loop (hundreds of connections, 300 KB bodies) times
    every probe on that loop by its own stall as much as by the server's: `/health` p99 of 2.2-2.7 s
    for both targets with half a core idle on the server's side, 10-30 ms from a process of its own.

    It also leaves the client's session (`own_session`), as a real prober (a kubelet, a load balancer) is not
    in the load generator's: with the kernel's autogroups a session shares the CPU as one, so a probe in the
    saturated client's session waits behind the client as well as behind the server (stops 18-53 probed
    from there: docs/benchmarks-notes.md, stop54).
    """

    def __init__(self, url: str, interval_s: float, beside: str | None = None, own_session: bool = True) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._parent, child = spawn.Pipe()
        args = (child, url, interval_s, beside, own_session)
        self._process = spawn.Process(target=_probe_until_told, args=args, daemon=True, name=PROCESS_NAME)

    def __enter__(self) -> ProbeProcess:
        self._process.start()
        self._parent.recv()  # "ready": imported and probing
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.kill()  # after stop() it has already ended
        self._process.join()

    def stop(self) -> list[HealthSample]:
        self._parent.send("stop")
        samples: list[HealthSample] = self._parent.recv()
        self._process.join()
        return samples


def _probe_until_told(conn: Connection, url: str, interval_s: float, beside: str | None, own_session: bool) -> None:
    if own_session:
        os.setsid()

    async def run() -> list[HealthSample]:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(conn.fileno(), stop.set)
        async with httpx.AsyncClient(timeout=300) as client:
            for each in (url, beside) if beside else (url,):
                await warm_up(client, each)
            task = asyncio.create_task(probe(client, url, stop, interval_s, beside))
            conn.send("ready")
            return await task

    conn.send(asyncio.run(run()))


async def warm_up(client: httpx.AsyncClient, url: str) -> None:
    """One probe not recorded: a fresh process's first request pays for its client's lazy imports and its
    connection (27-30 ms here against an idle server that answers the next ones in 1 ms), which then
    stood among the top 1 % of a minute's probes of any server, idle or loaded."""
    # A server that does not answer fails the recorded probes too, and each of those is a sample.
    with contextlib.suppress(httpx.HTTPError):
        await client.get(f"{url}/health")


async def loop_lag(stop: asyncio.Event, interval_s: float = 0.01) -> list[float]:
    """How late this client's own event loop wakes a 10 ms sleeper, until `stop` is set.

    Request and probe times are all taken on this loop: while it lags, the client is slow, not the
    server, and /health spikes or long ITLs of that moment are the client's own.
    """
    lags = []
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(interval_s)
        lags.append(max(0.0, time.perf_counter() - before - interval_s))
    return lags


def per_second(samples: Sequence[HealthSample], t0: float) -> list[list[float | int]]:
    """The samples in one-second bins from `t0`: [second, probes, p50 ms, max ms, not 200], for plots
    and result files that must stay small (a probe every 100 ms is thousands per run)."""
    bins: dict[int, list[HealthSample]] = {}
    for s in samples:
        bins.setdefault(int(s.sent_at - t0), []).append(s)
    series: list[list[float | int]] = []
    for second in sorted(bins):
        ms = [s.latency * 1000 for s in bins[second]]
        failures = sum(s.status != 200 for s in bins[second])
        series.append([second, len(ms), round(percentile(ms, 50), 3), round(max(ms), 3), failures])
    return series


def summarize(samples: Sequence[HealthSample]) -> dict[str, Any]:
    """Latency in ms (n, mean, p50, p95, p99, max) of every probe, and how many were not a 200."""
    summary: dict[str, Any] = dict(summary_ms([s.latency for s in samples]))
    summary["failures"] = sum(s.status != 200 for s in samples)
    return summary
