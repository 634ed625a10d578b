"""Text probes beside the load: one at a time, distinct prompts, TTFT pooled per target and level."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import httpx
import pytest

from load.bench import main, report, text_probe
from load.bench.cli import parse_args
from load.bench.client import RequestRecord, request_body
from load.bench.datasets import WordDataset
from load.bench.runner import Cell, CellResult, Runner, Target, Workload
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.bench_support import serving
from tests.unit.conftest import MODEL_NAME

WORDS = ("the", "of", "and", "to")


def served(ttft: float, stages: dict[str, float] | None = None) -> RequestRecord:
    return RequestRecord(sent_at=0.0, input_len=8, status=200, latency=ttft, content_times=[ttft],
                         stage_ms=stages or {})  # fmt: skip


def refused() -> RequestRecord:
    return RequestRecord(sent_at=0.0, input_len=8, status=503, error="HTTP 503", latency=0.001)


def test_probe_prompts_are_apart_from_the_load_prompts() -> None:
    load = WordDataset(WORDS, (8,), 32, seed=0)
    probes = text_probe.dataset(WORDS, 8, seed=0)
    assert probes.output_len == 1 and probes.input_lens == (8,)
    assert "priority" not in request_body("chat", "m", probes.prompt(0))  # 0: not sent
    urgent = text_probe.dataset(WORDS, 8, seed=0, priority=-1).prompt(0)
    assert (urgent.text, request_body("chat", "m", urgent)["priority"]) == (probes.prompt(0).text, -1)
    assert {probes.prompt(i).text for i in range(20)}.isdisjoint(load.prompt(i).text for i in range(20))


async def test_probes_go_one_at_a_time_from_the_given_prompt_until_stopped(services: Services) -> None:
    in_flight = most = 0
    app = create_app(services)
    bodies: list[bytes] = []

    async def counting(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        nonlocal in_flight, most

        async def recording():  # type: ignore[no-untyped-def]
            message = await receive()
            bodies.append(message.get("body", b""))
            return message

        in_flight += 1
        most = max(most, in_flight)
        try:
            await app(scope, recording, send)
        finally:
            in_flight -= 1

    prompts = text_probe.dataset(WORDS, 4, seed=0)
    stop = asyncio.Event()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=counting)) as client:
        task = asyncio.create_task(text_probe.probe(client, "http://app", "chat", MODEL_NAME, prompts, 5, stop, 0.0))
        await asyncio.sleep(0.5)
        stop.set()
        records = await task
    assert len(records) >= 2 and most == 1
    first = json.loads(bodies[0])["messages"][0]["content"]
    assert first == prompts.prompt(5).text  # from `first_index` on
    assert all(r.ok and r.output_tokens == 1 and len(r.content_times) == 1 for r in records), records[0].detail


async def test_a_slow_probe_delays_the_next_instead_of_piling_up() -> None:
    sent: list[float] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        sent.append(time.perf_counter())
        await asyncio.sleep(0.1)
        return httpx.Response(503)

    stop = asyncio.Event()
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        task = asyncio.create_task(
            text_probe.probe(client, "http://x", "completions", "m", text_probe.dataset(WORDS, 4, 0), 0, stop, 0.02)
        )
        await asyncio.sleep(0.35)
        stop.set()
        records = await task
    assert all(later - earlier >= 0.1 for earlier, later in itertools.pairwise(sent))
    assert len(records) == len(sent) and not any(r.ok for r in records)


def test_summary_counts_failures_and_times_only_the_served() -> None:
    assert text_probe.summarize([]) is None
    summary = text_probe.summarize([served(0.010), served(0.030), refused()])
    assert summary is not None
    assert (summary["sent"], summary["failed"], summary["ttft_ms"]["n"]) == (3, 1, 2)
    assert summary["ttft_ms"]["p50"] == pytest.approx(20.0)


def cell(target: str, probes: list[RequestRecord]) -> CellResult:
    return CellResult(Cell(0, 8.0, target), 0.0, 1.0, [served(0.2)], [], [0.001], None, probes)


def test_the_report_pools_probes_and_shows_their_table_only_when_sent() -> None:
    workload = Workload(mode="concurrency", levels=(8.0,), duration_s=1.0, text_probe_interval_s=0.5)
    targets = {"graph": {"url": "http://a"}, "vllm": {"url": "http://b"}}
    probes = [served(0.04, {"tokenizer": 1.0, "llm_first_chunk": 30.0}), served(0.06, {"llm_first_chunk": 50.0})]
    cells = [cell("graph", probes), cell("vllm", [refused()])]
    results = report.jsonable(report.build(cells, workload, targets, {"text_probe_interval": 0.5}, {}))
    json.dumps(results, allow_nan=False)
    assert results["results"]["graph"]["8"]["text_probe"]["ttft_ms"]["p50"] == pytest.approx(50.0)
    assert results["cells"][0]["text_probe_ttft_p50_ms"] == pytest.approx(50.0)
    table = report.markdown(results)
    assert "Short text requests beside the load (one at a time, every 0.5 s" in table
    assert "| graph | 8 | 2 | 0 | 0 | 50.0 | 50.0 |" in table
    assert "| llm_first_chunk 40.0, tokenizer 1.0 |" in table  # each stage over the probes that reported it
    assert "| vllm | 8 | 1 | 1 | 0 | - | - | - | - | - | - |" in table  # none served: no TTFT, no stages

    results["config"]["text_probe_priority"] = -1
    assert "(one at a time, every 0.5 s, priority -1, one token out" in report.markdown(results)

    without = report.jsonable(report.build([cell("graph", []), cell("vllm", [])], workload, targets, {}, {}))
    assert "text_probe" not in without["results"]["graph"]["8"] and "text_probe_ttft_p50_ms" not in without["cells"][0]
    assert "Short text requests" not in report.markdown(without)


async def test_each_cell_continues_the_targets_probe_prompts() -> None:
    bodies: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content)["prompt"])
        return httpx.Response(503)

    workload = Workload(mode="concurrency", levels=(1.0,), duration_s=0.1, text_probe_interval_s=0.01)
    prompts = text_probe.dataset(WORDS, 16, 0)  # 4 words in 16 places: no prompt repeats by chance
    runner = Runner([Target("a", "http://a", "m")], prompts, workload, progress=None, probe_prompts=prompts)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        texts = [await runner._text_probes(client, runner.targets["a"], _stopped_after(0.05)) for _ in range(2)]
    assert len(texts[0]) >= 1 and len(texts[1]) >= 1
    assert len(set(bodies)) == len(bodies)  # the second cell did not start over


def _stopped_after(seconds: float) -> asyncio.Event:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    return stop


def test_bench_sends_probes_beside_the_load(services: Services, tmp_path: Path) -> None:
    with serving(create_app(services)) as url:
        results = main([
            "--target", f"a={url}", "--concurrency", "2", "--duration", "1.0", "--input-len", "16",
            "--output-len", "4", "--text-probe-interval", "0.05", "--text-probe-len", "8", "--rest", "0",
            "--out", str(tmp_path), "--no-plots", "--no-progress",
        ])  # fmt: skip
    probes = results["results"]["a"]["2"]["text_probe"]
    assert probes["sent"] >= 2 and probes["failed"] == 0 and probes["ttft_ms"]["n"] == probes["sent"]
    assert "Short text requests beside the load" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--target", "a=http://x", "--text-probe-interval", "-1"],
        ["--target", "a=http://x", "--text-probe-interval", "1", "--text-probe-len", "0"],
        ["--target", "a=http://x", "--dataset", "tts", "--text-probe-interval", "1"],
        ["--target", "a=http://x", "--text-probe-priority", "-1"],
    ],
)
def test_bad_probe_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


async def test_probes_end_with_the_load_not_an_interval_later() -> None:
    stop = asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        stop.set()  # the load ends while the first probe is out
        return httpx.Response(503)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        started = time.perf_counter()
        records = await text_probe.probe(
            client, "http://x", "completions", "m", text_probe.dataset(WORDS, 4, 0), 0, stop, 30.0
        )
    assert len(records) == 1 and time.perf_counter() - started < 5.0
