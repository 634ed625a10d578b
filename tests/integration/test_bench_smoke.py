"""The benchmark CLI runs end to end against the real graph (a short smoke run, not a measurement)."""

from __future__ import annotations

from pathlib import Path

from load.bench import main


def test_bench_smoke_run(graph: str, tmp_path: Path) -> None:
    args = f"--target graph={graph} --concurrency 2 --duration 3 --input-len 64 --output-len 8 --goodput ttft:5000"
    results = main([*args.split(), "--rest", "1", "--no-progress", "--out", str(tmp_path)])
    cell = results["results"]["graph"]["2"]
    assert cell["completed"] >= 2
    assert cell["failed"] == 0
    assert cell["total_output_tokens"] == 8 * cell["completed"]
    assert cell["ttft_ms"]["p50"] > 0
    assert cell["health_ms"]["p50"] > 0
    assert cell["cpu"]["rest_outside_engine_core_share"] > 0  # Ray's own processes are never idle
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "results.md", "latency_vs_level.png"}
