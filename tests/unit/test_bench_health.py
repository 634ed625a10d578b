"""The /health probe's pacing and failure recording, and the client's own event-loop lag."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import time

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from load.bench.health import PROCESS_NAME, HealthSample, ProbeProcess, loop_lag, probe, summarize
from tests.unit.bench_support import serving


async def run_probe(handler: httpx.MockTransport, seconds: float, interval_s: float) -> list[HealthSample]:
    stop = asyncio.Event()
    async with httpx.AsyncClient(transport=handler) as client:
        task = asyncio.create_task(probe(client, "http://server", stop, interval_s))
        await asyncio.sleep(seconds)
        stop.set()
        return await task


async def test_probes_every_interval_and_counts_non_200() -> None:
    statuses = iter([200, 503] * 10)
    samples = await run_probe(httpx.MockTransport(lambda _: httpx.Response(next(statuses))), 0.35, 0.1)
    # 4 probes at 0, 0.1, 0.2, 0.3 s; 3 if this busy machine delays one (never more than one per interval).
    assert [s.status for s in samples] == [200, 503, 200, 503][: len(samples)] and len(samples) >= 3
    gaps = [b.sent_at - a.sent_at for a, b in itertools.pairwise(samples)]
    assert all(0.095 < gap < 0.2 for gap in gaps), gaps
    summary = summarize(samples)
    assert (summary["n"], summary["failures"]) == (len(samples), len(samples) // 2)


async def test_unanswered_probes_are_samples() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    samples = await run_probe(httpx.MockTransport(refuse), 0.15, 0.1)
    assert [(s.status, s.error) for s in samples] == [(None, "ConnectError")] * 2
    assert summarize(samples)["failures"] == 2


async def test_loop_lag_sees_a_blocked_loop() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(loop_lag(stop))
    await asyncio.sleep(0.05)
    time.sleep(0.1)  # what a CPU-bound client would do to every timestamp it takes
    await asyncio.sleep(0.05)
    stop.set()
    lags = await task
    assert max(lags) >= 0.08
    assert sorted(lags)[len(lags) // 2] < 0.03


async def test_a_probe_process_probes_until_stopped_on_this_processs_clock() -> None:
    app = FastAPI()
    served: list[float] = []

    def health() -> JSONResponse:
        served.append(time.perf_counter())
        return JSONResponse({})

    app.get("/health")(health)
    with serving(app) as url, ProbeProcess(url, 0.05) as prober:
        started = time.perf_counter()
        await asyncio.sleep(0.3)
        samples = prober.stop()
        stopped = time.perf_counter()
    assert len(samples) >= 3 and all(s.status == 200 for s in samples)
    assert started - 1.0 < samples[0].sent_at and samples[-1].sent_at < stopped
    assert len(served) == len(samples) + 1  # the first, the client's own warm-up, is not a sample


async def test_a_probe_process_leaves_the_clients_session_unless_told_not_to() -> None:
    app = FastAPI()
    app.get("/health")(lambda: JSONResponse({}))
    with serving(app) as url:
        for own_session in (False, True):
            with ProbeProcess(url, 0.05, own_session=own_session) as prober:
                (child,) = [p for p in multiprocessing.active_children() if p.name == PROCESS_NAME]
                assert child.pid is not None
                assert (os.getsid(child.pid) == child.pid) is own_session
                assert (os.getsid(child.pid) == os.getsid(0)) is not own_session
                prober.stop()
