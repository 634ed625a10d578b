"""The page's sections for the engine ceiling and tokenizer throughput, from hand-made results."""

from __future__ import annotations

from typing import Any

from load import benchmarks_page

META = {"command": "python -m load.x --y", "date": "2026-01-01T00:00:00+00:00", "machine": "2 cores"}


def test_ceiling_section() -> None:
    result: dict[str, Any] = {
        **META, "kind": "ceiling", "label": "", "model": "tiny-chat", "requests": 256, "concurrency": 256,
        "input_len": 256, "output_len": 32, "duration_s": 5.0, "request_throughput": 51.2,
        "output_throughput": 1638.4,
    }  # fmt: skip
    page = benchmarks_page.render([result], notes=None)
    assert "## Engine ceiling, offline (tiny-chat, 256 in / 32 out, 256 in flight)" in page
    assert "| 256 | 5.0 | 51.20 | 1,638.4 |" in page
    assert "- command: `python -m load.x --y`" in page


def test_tokenizer_throughput_section() -> None:
    def path(how: str, prompts_per_s: float, vs: float) -> dict[str, Any]:
        return {"how": how, "prompts_per_s": prompts_per_s, "tokens_per_s": prompts_per_s * 266, "vs_reference": vs}

    result: dict[str, Any] = {
        **META, "kind": "tokenizer_throughput", "label": "graph at nice 15", "prompts": 1000, "rounds": 3,
        "input_len": 256, "tokens_per_prompt": 266.0,
        "paths": {"reference": path("HF, 1 thread", 2000, 1.0), "stage": path("stage, 2 threads", 1500, 0.75),
                  "graph": path("POST /tokenize", 500, 0.25)},
    }  # fmt: skip
    page = benchmarks_page.render([result], notes=None)
    assert "## Tokenizer throughput (1000 chat prompts x 3 rounds, 256 words, 266 tokens each)" in page
    assert "| reference | HF, 1 thread | 2,000 | 532,000 | 1.00x |" in page
    assert "| graph | POST /tokenize | 500 | 133,000 | 0.25x |" in page
    assert "- setup: graph at nice 15" in page


def test_overload_and_soak_sections() -> None:
    level = {
        "multiplier": 1.0, "rate": 10.0, "sent": 10, "offered_rate": 10.0, "succeeded": 9, "rejected": 1,
        "errors": {}, "error_details": [], "balanced": True, "clean": True, "wall_s": 1.0, "throughput": 9.0,
        "goodput": 8.0, "ttft_ms": {"p50": 50.0, "p99": 90.0}, "rejection_latency_ms": {"p50": 2.0, "p99": 3.0},
        "health_ms": {"p99": 4.0}, "client_loop_lag_ms": {"max": 1.0}, "rss": {},
    }  # fmt: skip
    overload: dict[str, Any] = {
        **META, "kind": "overload", "label": "", "capacity": 10.0, "ttft_slo_ms": 500.0, "levels": [level],
        "clean": True, "target": {"url": "http://x", "model": "tiny-chat"},
        "config": {"multipliers": [1.0], "duration": 60.0, "dataset": "random", "endpoint": "chat", "input_len": 256},
    }  # fmt: skip
    soak: dict[str, Any] = {
        **META, "kind": "soak", "label": "", "rates": {"text": 2.0}, "utilization": None, "duration_s": 600.0,
        "window_s": 60.0, "requests": {"text": 1200}, "errors": 0, "error_list": [], "windows": [], "rss_run": {},
    }  # fmt: skip
    page = benchmarks_page.render([overload, soak], notes=None)
    assert "## Overload: Poisson arrivals at 1x capacity, 60 s each (random chat, 256 in, tiny-chat)" in page
    assert "| 1x | 10.00 | 10 | 9 | 1 | 0 | yes | 9.00 | 8.00 | 50.0 | 90.0 | 2.0 | 3.0 | 4.0 | 1.0 |" in page
    assert "## Soak: mixed text, image and speech traffic for 10 min" in page
    assert "Errors: 0 of 1200 requests (none)" in page
