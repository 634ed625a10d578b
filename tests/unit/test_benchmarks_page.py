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
