"""`load.bench.main` end to end against the ingress app (real tokenizer, FakeLLM) on a real port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from load.bench import main
from load.bench.cli import parse_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline import Services
from tests.unit.bench_support import serving


@pytest.fixture
def url(services: Services) -> Iterator[str]:
    with serving(create_app(services)) as base_url:
        yield base_url


def test_two_targets_interleaved(url: str, tmp_path: Path) -> None:
    results = main([
        "--target", f"a={url}", "--target", f"b={url}/", "--concurrency", "1", "2", "--duration", "0.3",
        "--rounds", "2", "--input-len", "16", "--output-len", "4", "--goodput", "ttft:10000", "tpot:10000",
        "--health-interval", "0.05", "--out", str(tmp_path), "--no-progress",
    ])  # fmt: skip
    assert [c["target"] for c in results["cells"]] == ["a", "b", "b", "a", "b", "a", "a", "b"]
    for target in ("a", "b"):
        for level in ("1", "2"):
            m = results["results"][target][level]
            assert m["completed"] > 0 and m["failed"] == 0
            assert m["total_output_tokens"] == 4 * m["completed"]
            assert m["total_input_tokens"] == 16 * m["completed"]
            assert m["request_goodput"] == m["request_throughput"]
            assert m["health_ms"]["n"] > 0 and m["health_ms"]["failures"] == 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "results.json", "results.md", "latency_vs_level.png", "health_over_time.png",
    }  # fmt: skip
    assert json.loads((tmp_path / "results.json").read_text())["levels"] == ["1", "2"]
    assert "| a | 2 |" in (tmp_path / "results.md").read_text()


def test_long_prompts_at_a_request_rate(url: str, tmp_path: Path) -> None:
    # Context 128, output 8: 0.3 -> 38 tokens (served), 2.0 -> 256 tokens (refused with 400).
    results = main([
        "--target", f"graph={url}", "--endpoint", "chat", "--dataset", "long", "--long-fractions", "0.3", "2.0",
        "--output-len", "8", "--request-rate", "40", "--max-concurrency", "4", "--duration", "0.5",
        "--warmup", "0", "--out", str(tmp_path), "--no-plots", "--no-progress",
    ])  # fmt: skip
    assert results["config"]["input_lens"] == [38, 256]
    m = results["results"]["graph"]["40"]
    assert m["completed"] > 0 and m["errors"] == {"HTTP 400": m["failed"]}
    assert abs(m["completed"] - m["failed"]) <= 1  # the two lengths alternate
    assert m["request_goodput"] is None
    assert (
        "Failures (--dataset long: prompts beyond the context are refused by design): graph @ 40: {'HTTP 400':"
        in (tmp_path / "results.md").read_text()
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--target", "a=http://x", "--max-concurrency", "4"],
        ["--target", "a=http://x", "--concurrency", "0"],
        ["--target", "a=http://x", "--goodput", "ttft"],
        ["--target", "a=http://x", "--concurrency", "2", "--request-rate", "1"],
        ["--target", "http://x"],
        ["--target", "a=x:8000"],
        ["--target", "a=http://x", "--target", "a=http://y"],
        ["--target", "baseline=http://x", "--start", "baseline"],
    ],
)
def test_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
