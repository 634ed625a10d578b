"""The page's sections from hand-made results, and the page from committed result files end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from load import benchmarks_page
from load.bench import report
from load.bench.client import RequestRecord
from load.bench.health import HealthSample
from load.bench.runner import Cell, CellResult, Workload
from load.overhead import added_per_token_ms

META = {"command": "python -m load.x --y", "date": "2026-01-01T00:00:00+00:00", "machine": "2 cores"}


def test_ceiling_section() -> None:
    result: dict[str, Any] = {
        **META, "kind": "ceiling", "label": "", "model": "tiny-chat", "requests": 256, "concurrency": 256,
        "input_len": 256, "output_len": 32, "duration_s": 5.0, "request_throughput": 51.2,
        "output_throughput": 1638.4,
    }  # fmt: skip
    page = benchmarks_page.render([result], notes=None)
    assert "## Engine ceiling, offline (tiny-chat, 256 in / 32 out, 256 in flight, greedy sampling)" in page
    assert "| 256 | 5.0 | 51.20 | 1,638.4 |" in page
    assert "- command: `python -m load.x --y`" in page


def test_health_probe_section_counts_each_kind_of_answer() -> None:
    phase = {"p50": 3.0, "p95": 9.0, "p99": 15.0, "max": 24.0}
    target = {"idle_health_ms": phase, "loaded_health_ms": phase, "requests_per_s": 135.0,
              "responses": {"400": 8099, "ReadError": 2}}  # fmt: skip
    result = {**META, "kind": "health_probe", "label": "", "concurrency": 60, "words_per_prompt": 50000,
              "duration_s": 60.0, "targets": {"graph": target}}  # fmt: skip
    page = benchmarks_page.render([result], None)
    assert "| graph | 3.0 | 3.0 | 9.0 | 15.0 | 24.0 | 135.0 | 400: 8,099, ReadError: 2 | 1.00x |" in page
    assert "The floor" not in page
    assert "Where the probes ran was not recorded" in page  # files before stop 54 do not say


def test_health_probe_section_says_where_the_probes_ran() -> None:
    phase = {"p50": 3.0, "p95": 9.0, "p99": 15.0, "max": 24.0}
    target = {"idle_health_ms": phase, "loaded_health_ms": phase, "requests_per_s": 135.0, "responses": {"400": 9}}
    result = {**META, "kind": "health_probe", "label": "", "concurrency": 60, "words_per_prompt": 50000,
              "duration_s": 60.0, "probe_session": "own", "targets": {"graph": target}}  # fmt: skip
    page = benchmarks_page.render([result], None)
    assert "from a process in a session of its own" in page and "load client's session" not in page


def test_health_probe_section_shows_the_floor_beside_each_target() -> None:
    phase = {"p50": 3.0, "p95": 9.0, "p99": 15.0, "max": 24.0}
    target = {"idle_health_ms": phase, "loaded_health_ms": phase, "requests_per_s": 135.0, "responses": {"400": 9},
              "floor_health_ms": {"p50": 1.0, "p95": 5.0, "p99": 8.5, "max": 20.0},
              "above_floor_ms": {"p50": 0.5, "p95": 2.0, "p99": 4.5, "max": 11.0}}  # fmt: skip
    result = {**META, "kind": "health_probe", "label": "", "concurrency": 60, "words_per_prompt": 50000,
              "duration_s": 60.0, "floor": "haproxy-refuser", "targets": {"graph": target, "vllm": target}}  # fmt: skip
    page = benchmarks_page.render([result], None)
    assert "The floor: `haproxy-refuser` (answering `/health` from its config alone" in page
    assert "| graph | 15.0 | 1.0 | 8.5 | 0.5 | 4.5 | 11.0 |" in page
    assert "| vllm | 15.0 | 1.0 | 8.5 | 0.5 | 4.5 | 11.0 |" in page
    assert "as the kernel stamped them" not in page  # a run from before the stamps


def test_health_probe_section_shows_the_kernels_stamps_when_taken() -> None:
    phase = {"p50": 3.0, "p95": 9.0, "p99": 15.0, "max": 24.0}
    stamped = {"p50": 0.2, "p95": 0.4, "p99": 0.6, "max": 2.0, "unstamped": 1}
    graph = {
        "idle_health_ms": phase,
        "loaded_health_ms": phase,
        "requests_per_s": 135.0,
        "responses": {"400": 9},
        "loaded_health_stamped_ms": stamped,
        "floor_health_stamped_ms": stamped | {"p50": 0.1, "p99": 0.3},
    }
    vllm = {k: v for k, v in graph.items() if k != "floor_health_stamped_ms"}
    result = {**META, "kind": "health_probe", "label": "", "concurrency": 60, "words_per_prompt": 50000,
              "duration_s": 60.0, "targets": {"graph": graph, "vllm": vllm}}  # fmt: skip
    page = benchmarks_page.render([result], None)
    assert "The same loaded probes as the kernel stamped them" in page
    assert "| graph | 0.2 | 0.6 | 2.0 | 1 | 0.1 | 0.3 |" in page
    assert "| vllm | 0.2 | 0.6 | 2.0 | 1 | - | - |" in page


def test_idle_cpu_section() -> None:
    roles = {"api_server": {"processes": 2, "core_share": 0.003}}
    targets = {"vllm": {"roles": roles, "outside_engine_core_share": 0.003, "total_core_share": 0.024}}
    result = {**META, "kind": "idle_cpu", "label": "", "seconds": 30.0, "targets": targets}
    page = benchmarks_page.render([result], None)
    assert "## CPU at rest, by process role (30 s, no load sent)" in page
    assert "| vllm | api_server | 2 | 0.0030 |" in page
    assert "| vllm | **all** | | **0.024** |" in page


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


def test_overhead_section_adds_per_token_without_the_added_ttft() -> None:
    def target(ttft: float, e2e: float) -> dict[str, Any]:
        return {"ttft_ms": {"p50": ttft, "p99": ttft}, "e2e_ms": {"p50": e2e, "p99": e2e}}

    graph = {**target(28.0, 169.5), "added_ttft_ms_p50": 19.4, "added_e2e_ms_p50": 37.0,
             "added_per_token_ms_p50": 37.0 / 32}  # what older files hold: dE2E / n  # fmt: skip
    result: dict[str, Any] = {
        **META, "kind": "overhead", "rounds": 40, "prompt_tokens": 27, "max_tokens": 32,
        "targets": {"graph": graph, "engine_direct": target(8.6, 132.5)},
    }  # fmt: skip
    page = benchmarks_page.render([result], notes=None)
    assert "| graph | 28.0 | 28.0 | 169.5 | 169.5 | 19.4 | 0.57 |" in page  # (37.0 - 19.4) / 31
    assert "| engine_direct | 8.6 | 8.6 | 132.5 | 132.5 | - | - |" in page
    assert added_per_token_ms(37.0, 19.4, 32) == pytest.approx(17.6 / 31)
    with pytest.raises(ValueError):
        added_per_token_ms(37.0, 19.4, 1)


def bench_result(command: str, date: str) -> dict[str, Any]:
    """A load.bench results.json, graph against vllm at concurrency 1 and 8, as `load.bench` writes it."""
    workload = Workload(mode="concurrency", levels=(1.0, 8.0), duration_s=1.0, endpoint="chat")
    cells = []
    for i, (level, name) in enumerate([(1.0, "graph"), (1.0, "vllm"), (8.0, "vllm"), (8.0, "graph")]):
        ttft = 0.05 * level * (2 if name == "graph" else 1)
        served = int(level) * (1 if name == "graph" else 2)
        records = [RequestRecord(sent_at=0.0, input_len=8, status=200, latency=ttft + 0.1,
                                 content_times=[ttft, ttft + 0.1], prompt_tokens=8, output_tokens=2)
                   for _ in range(served)]  # fmt: skip
        probes = [HealthSample(10.0 + i + k / 10, 0.002 * (k + 1), 200) for k in range(10)]
        cells.append(CellResult(Cell(0, level, name), 10.0 + i, 1.0, records, probes, [0.001]))
    targets = {name: {"url": f"http://{name}", "model": "tiny-chat"} for name in ("graph", "vllm")}
    config = {"dataset": "random", "input_len": 8, "output_len": 2, "endpoint": "chat", "duration": 1.0, "rounds": 1}
    result: dict[str, Any] = report.jsonable(report.build(cells, workload, targets, config, {}))
    result.update(kind="bench", label="synthetic", command=command, date=date, machine="2 cores")
    return result


def test_the_page_from_committed_results_end_to_end(tmp_path: Path) -> None:
    raw = tmp_path / "results.json"
    # Before 2026-11-22 a --start target ran in a scheduling group of its own: its ratios must be flagged.
    raw.write_text(json.dumps(bench_result("python -m load.bench --target graph=http://g --start vllm",
                                           "2026-11-21T21:18:06+00:00")))  # fmt: skip
    results_dir, page, notes = tmp_path / "docs" / "benchmarks", tmp_path / "docs" / "benchmarks.md", tmp_path / "n.md"
    notes.write_text("Hand-written.\n")
    results_dir.mkdir(parents=True)
    (results_dir / "00-gone-load.png").write_bytes(b"a plot whose result file was removed")
    benchmarks_page.main(["--add", str(raw), "10-text", "--dir", str(results_dir), "--page", str(page),
                          "--notes", str(notes)])  # fmt: skip

    committed = json.loads((results_dir / "10-text.json").read_text())
    assert "health_timeline" not in committed  # every probe: too big to commit
    assert committed["health_series"]["graph"][0] == [0, 10, 11.0, 20.0, 0]  # second, probes, p50, max, failures
    assert sorted(p.name for p in results_dir.iterdir()) == ["10-text-health.png", "10-text-load.png", "10-text.json"]
    for png in results_dir.glob("*.png"):
        assert png.read_bytes().startswith(b"\x89PNG")

    text = page.read_text()
    assert "## 10-text: chat (random 8 in / 2 out), concurrency 1, 8, 1 s x 1 rounds per target and level" in text
    assert "![req/s and latency against the load level](benchmarks/10-text-load.png)" in text
    assert "![/health latency over the run](benchmarks/10-text-health.png)" in text
    assert "| graph | 1 | 1 | 0 | 1.00 |" in text and "| vllm | 8 | 16 | 0 | 16.00 |" in text
    assert "| vllm | 8 | ⚠ 0.50x (handicapped) | ⚠ 2.00x (handicapped) |" in text
    assert "`vllm`: started by --start in a session of its own" in text
    assert "- command: `python -m load.bench --target graph=http://g --start vllm`" in text
    assert text.rstrip().endswith("Hand-written.")

    # The same run after the fix: plain ratios. An empty directory: a page that says so.
    (results_dir / "10-text.json").write_text(json.dumps(compact_bench("2026-11-23T00:00:00+00:00")))
    benchmarks_page.main(["--dir", str(results_dir), "--page", str(page), "--notes", str(notes)])
    assert "| vllm | 8 | 0.50x | 2.00x |" in page.read_text() and "(handicapped)" not in page.read_text()
    (results_dir / "10-text.json").unlink()
    benchmarks_page.main(["--dir", str(results_dir), "--page", str(page), "--notes", str(tmp_path / "none.md")])
    assert "No result file in" in page.read_text() and not list(results_dir.glob("*.png"))


def compact_bench(date: str) -> dict[str, Any]:
    return benchmarks_page.compact(bench_result("python -m load.bench --target graph=http://g --start vllm", date))


def test_a_result_too_big_to_commit_is_refused(tmp_path: Path) -> None:
    raw = tmp_path / "results.json"
    raw.write_text(json.dumps({**META, "kind": "soak", "windows": ["x" * 1000] * 300}))
    with pytest.raises(SystemExit, match="more than"):
        benchmarks_page.add(raw, "big", tmp_path / "out")
    assert not (tmp_path / "out").exists()
