"""load/health_probe.py: `/health` probed, from a process of its own, while long prompts load the server."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from load.bench.health import HealthSample
from load.health_probe import floor_summary, load, long_prompt, measure
from tests.unit.bench_support import serving


async def test_measure_probes_health_idle_and_beside_the_load() -> None:
    app = FastAPI()
    app.get("/health")(lambda: JSONResponse({}))
    app.post("/v1/completions")(lambda: JSONResponse({"error": {"message": "too long"}}, status_code=400))
    with serving(app) as url:
        result = await measure(url, concurrency=2, duration_s=0.5, prompts=[long_prompt(100, 0)], own_session=True)
    assert set(result["responses"]) == {400}
    for phase in ("idle_health_ms", "loaded_health_ms"):
        assert result[phase]["n"] >= 3 and result[phase]["failures"] == 0, result
    stamped = result["loaded_health_stamped_ms"]
    assert stamped["n"] == result["loaded_health_ms"]["n"] and stamped["unstamped"] == 0, result
    assert result["load_client_lag_max_ms"] >= 0
    assert "floor_health_ms" not in result


async def test_the_floor_is_probed_beside_the_loaded_target() -> None:
    app, floor = FastAPI(), FastAPI()
    app.get("/health")(lambda: JSONResponse({}))
    app.post("/v1/completions")(lambda: JSONResponse({"error": {"message": "too long"}}, status_code=400))
    floor.get("/health")(lambda: JSONResponse({}))
    with serving(app) as url, serving(floor) as floor_url:
        result = await measure(
            url, concurrency=2, duration_s=0.5, prompts=["a"], floor_url=floor_url, own_session=False
        )
    assert result["floor_health_ms"]["n"] == result["loaded_health_ms"]["n"] >= 3, result
    assert result["floor_health_ms"]["failures"] == 0 and result["above_floor_ms"]["n"] >= 3, result
    assert result["floor_health_stamped_ms"]["n"] == result["floor_health_ms"]["n"], result


def test_the_own_share_is_the_target_minus_the_floor_beside_it() -> None:
    def pair(target_s: float, floor_s: float) -> HealthSample:
        return HealthSample(0.0, target_s, 200, beside=HealthSample(0.0, floor_s, 200))

    summary = floor_summary([pair(0.010, 0.004), pair(0.003, 0.002), pair(0.020, 0.019)])
    assert summary["above_floor_ms"]["max"] == pytest.approx(6.0) and summary["above_floor_ms"]["n"] == 3
    assert summary["floor_health_ms"]["max"] == pytest.approx(19.0)
    assert floor_summary([HealthSample(0.0, 0.010, 200)]) == {}


async def test_a_dropped_connection_is_counted_and_the_load_goes_on() -> None:
    stop, calls = asyncio.Event(), itertools.count()

    def answer(request: httpx.Request) -> httpx.Response:
        if next(calls) == 0:
            raise httpx.ReadError("connection reset", request=request)
        stop.set()
        return httpx.Response(400)

    statuses: Counter[int | str] = Counter()
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        await load(client, "http://server", stop, ["a prompt"], statuses)
    assert statuses == {"ReadError": 1, 400: 1}
