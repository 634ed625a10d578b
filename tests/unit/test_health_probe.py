"""load/health_probe.py: `/health` probed, from a process of its own, while long prompts load the server."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from load.health_probe import long_prompt, measure
from tests.unit.bench_support import serving


async def test_measure_probes_health_idle_and_beside_the_load() -> None:
    app = FastAPI()
    app.get("/health")(lambda: JSONResponse({}))
    app.post("/v1/completions")(lambda: JSONResponse({"error": {"message": "too long"}}, status_code=400))
    with serving(app) as url:
        result = await measure(url, concurrency=2, duration_s=0.5, prompts=[long_prompt(100, 0)])
    assert set(result["responses"]) == {400}
    for phase in ("idle_health_ms", "loaded_health_ms"):
        assert result[phase]["n"] >= 3 and result[phase]["failures"] == 0, result
    assert result["load_client_lag_max_ms"] >= 0
