"""Benchmark one or more OpenAI-compatible servers side by side, as `vllm bench serve` measures them:
request and output-token throughput, goodput, TTFT, TPOT, ITL and E2EL (mean, P50, P90, P99), with
`/health` probed every 100 ms beside the load, from a process in a session of its own (load/bench/health.py:
timed as that process sees it, and by the kernel's stamps). Targets take turns at each level, for --rounds
rounds.

  python -m load.bench --target graph=http://127.0.0.1:8000 --target baseline=http://127.0.0.1:8001 \\
      --concurrency 1 4 16 --duration 20 --rounds 3 --goodput ttft:500 tpot:50
  python -m load.bench --target graph=http://127.0.0.1:8000 --start baseline \\
      --endpoint chat --dataset long --request-rate 1 4 --max-concurrency 16
  python -m load.bench --target graph=http://127.0.0.1:8000 --start baseline:configs/cpu-tiny.yaml@tiny-llava \\
      --dataset image --images-per-request 2 --image-repeat 0.5 --concurrency 4
  python -m load.bench --target graph=http://127.0.0.1:8000 --start baseline:configs/cpu-tiny.yaml@tiny-orpheus \\
      --dataset tts --tts-input-chars 120 --voice tara --concurrency 1 8 32

Text to speech (--dataset tts) streams POST /v1/audio/speech as PCM and reports, as vLLM-Omni's TTS
benchmarks do, TTFA, RTF, underruns of a real-time player and seconds of audio per second
(definitions in metrics.py); 503 answers count as rejections, apart from failures. A speech cell goes
on past --duration until --min-streams (30) streams succeeded, and the report flags fewer.

CPU time (user + system) of every target's processes is read before and after each cell: CPU ms
per successful request outside the engine, and per process role (cpu.py says which processes are a
target's). A target given by URL is found by its listening port: run the bench on its machine.

Writes results.json, results.md, latency_vs_level.png and health_over_time.png under --out.
The client's own event-loop lag is measured too: a stalled client inflates every time it takes, and
results.md warns when it stalled (on a machine shared with the servers, try `nice -n -10`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from load.bench import cpu, images, report, targets, text_probe, tts
from load.bench.client import RequestRecord
from load.bench.datasets import (
    CAPABILITY,
    IMAGE_TEXT_LEN,
    TEXT_INPUT_LEN,
    Dataset,
    ModelInfo,
    WordDataset,
    fetch_model,
    long_input_lens,
    single_token_words,
)
from load.bench.metrics import MIN_STREAMS, parse_slos
from load.bench.runner import Cell, CellResult, Runner, Target, Workload
from load.meta import run_meta

# A cell's longest run for --min-streams: 30 streams of ~3.4 s audio at 1 stream at a time take ~2 min
# at real time, and a server that fails every request must not hold the run for ever.
MAX_DURATION_S = 300.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m load.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", action="append", default=[], metavar="NAME=URL", help="a running server; repeatable")
    p.add_argument(
        "--start",
        action="append",
        default=[],
        metavar="KIND[:ARG]",
        help=f"start a target for the run, named KIND; kinds: {', '.join(sorted(targets.LAUNCHERS))}",
    )
    p.add_argument("--endpoint", choices=["completions", "chat"], help="default: completions; chat for images")
    p.add_argument(
        "--dataset",
        choices=["random", "long", "image", "tts"],
        default="random",
        help="random: --input-len tokens; long: --long-fractions of the context; image: chat with --input-len "
        "text tokens and --images-per-request images; tts: speech of --tts-input-chars characters",
    )
    p.add_argument(
        "--input-len", type=int, help=f"prompt tokens (default {TEXT_INPUT_LEN}; image: {IMAGE_TEXT_LEN}, text only)"
    )
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument(
        "--long-fractions",
        type=float,
        nargs="+",
        default=[0.9, 1.5],
        help="prompt lengths as fractions of max_model_len, cycled; >= 1 are rejected by the server",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, nargs="+", help="fixed concurrency levels (default: 4)")
    load.add_argument("--request-rate", type=float, nargs="+", help="Poisson arrival rates, req/s")
    images.add_options(p)
    tts.add_options(p)
    p.add_argument("--max-concurrency", type=int, default=None, help="with --request-rate: cap on requests in flight")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load per target, level and round")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-rotate", action="store_true", help="keep the target order fixed in every round")
    p.add_argument(
        "--honor-retry-after",
        action="store_true",
        help="closed loop: after a 503 with Retry-After, a user waits that long before its next request",
    )
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests per target before the run")
    p.add_argument("--goodput", nargs="+", default=[], metavar="METRIC:MS", help="SLOs, e.g. ttft:500 tpot:50")
    p.add_argument("--health-interval", type=float, default=0.1, help="seconds between /health probes")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="results folder (default results/bench/<time>)")
    p.add_argument("--label", default="", help="what is special about this run (server config), for the report")
    p.add_argument(
        "--handicap", action="append", default=[], metavar="NAME=WHY",
        help="a target that runs at a disadvantage (e.g. another niceness): ratios against it are flagged",
    )  # fmt: skip
    p.add_argument(
        "--min-streams", type=int, default=MIN_STREAMS,
        help="speech, closed loop: a cell goes on past --duration until this many streams succeeded for the "
        "target and level (over all rounds), up to --max-duration; 0: --duration only",
    )  # fmt: skip
    p.add_argument(
        "--max-duration", type=float, help=f"seconds a cell may run for --min-streams (default {MAX_DURATION_S:g}, "
        "or --duration if longer)",
    )  # fmt: skip
    p.add_argument(
        "--text-probe-interval", type=float, default=0.0, metavar="SECONDS",
        help="beside the load, a short text request to the same model every this many seconds, one at a time, "
        "its TTFT reported apart (what a user waits for while images or long prompts load the server); 0: none",
    )  # fmt: skip
    p.add_argument("--text-probe-len", type=int, default=32, help="prompt tokens of each text probe")
    p.add_argument(
        "--text-probe-priority", type=int, default=0,
        help="the probes' `priority` (lower first; for engines run with `scheduling_policy: priority`, "
        "`vllm serve --scheduling-policy priority`); 0: not sent",
    )  # fmt: skip
    p.add_argument("--no-cpu", action="store_true", help="do not read the targets' processes' CPU time")
    p.add_argument(
        "--rest", type=float, default=30.0, metavar="SECONDS",
        help="after the last cell, read every target's CPU this long with nothing sent but /health probes (its "
        "background, which the tables subtract for the CPU per request above rest); 0: not read",
    )  # fmt: skip
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    opts = p.parse_args(argv)
    if not opts.target and not opts.start:
        p.error("give at least one --target NAME=URL or --start KIND")
    if opts.dataset == "image" and opts.endpoint == "completions":
        p.error("--dataset image needs --endpoint chat")
    if opts.dataset == "tts":
        if opts.endpoint or opts.input_len is not None or opts.goodput:
            p.error("--dataset tts: --endpoint, --input-len and --goodput do not apply (see --tts-input-chars)")
        if "vllm" in [item.partition(":")[0] for item in opts.start]:
            p.error("--start vllm: `vllm serve` has no /v1/audio/speech; for --dataset tts start the baseline "
                    "(--start baseline:CONFIG@tiny-orpheus) or give a speech server with --target")  # fmt: skip
        opts.endpoint = "speech"
    else:
        opts.endpoint = opts.endpoint or ("chat" if opts.dataset == "image" else "completions")
        if opts.input_len is None:
            opts.input_len = IMAGE_TEXT_LEN if opts.dataset == "image" else TEXT_INPUT_LEN
    opts.handicapped = {}
    for item in opts.handicap:
        name, sep, why = item.partition("=")
        if not sep or not name or not why:
            p.error(f"--handicap {item}: expected NAME=WHY")
        opts.handicapped[name] = why
    if opts.min_streams < 0 or (opts.max_duration is not None and opts.max_duration < opts.duration):
        p.error("--min-streams must not be negative, --max-duration not below --duration")
    opts.max_duration = opts.max_duration or max(MAX_DURATION_S, opts.duration)
    if opts.text_probe_interval < 0 or opts.text_probe_len < 1:
        p.error("--text-probe-interval must not be negative, --text-probe-len must be positive")
    if opts.text_probe_priority and not opts.text_probe_interval:
        p.error("--text-probe-priority needs --text-probe-interval")
    if opts.text_probe_interval and opts.dataset == "tts":
        p.error("--text-probe-interval: text probes go to a text model's endpoint, not to speech")
    if opts.max_concurrency is not None and opts.request_rate is None:
        p.error("--max-concurrency only applies with --request-rate")
    too_short = opts.input_len is not None and opts.input_len < 1  # None: speech has --tts-input-chars
    if opts.duration <= 0 or opts.rounds < 1 or opts.output_len < 1 or too_short:
        p.error("--duration, --rounds, --input-len and --output-len must be positive")
    if any(level <= 0 for level in opts.concurrency or opts.request_rate or []):
        p.error("load levels must be positive")
    try:
        opts.slos_ms = parse_slos(opts.goodput)
    except ValueError as exc:
        p.error(str(exc))
    opts.urls = {}
    for item in opts.target:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            p.error(f"--target {item}: expected NAME=http(s)://HOST:PORT")
        if name in opts.urls or name in [s.partition(":")[0] for s in opts.start]:
            p.error(f"--target {item}: the name {name} is taken")
        opts.urls[name] = url.rstrip("/")
    if unknown := set(opts.handicapped) - set(opts.urls) - {item.partition(":")[0] for item in opts.start}:
        p.error(f"--handicap: no target named {', '.join(sorted(unknown))}")
    return opts


class Bar:
    """A tqdm bar over the run's cells; its postfix counts the current cell's requests."""

    def __init__(self, total: int, disable: bool) -> None:
        self.bar = tqdm(total=total, unit="cell", disable=disable, dynamic_ncols=True)
        self.ok = self.failed = 0
        self.refreshed = 0.0

    def start_cell(self, cell: Cell) -> None:
        self.ok = self.failed = 0
        self.bar.set_description(f"round {cell.round} level {cell.level:g} {cell.target}")

    def request_done(self, record: RequestRecord) -> None:
        self.ok += record.ok
        self.failed += not record.ok
        # Redrawing on every response would cost the client CPU that the measurement needs.
        if time.monotonic() - self.refreshed > 0.5:
            self.refreshed = time.monotonic()
            self.bar.set_postfix(ok=self.ok, failed=self.failed)

    def end_cell(self, result: CellResult) -> None:
        self.bar.set_postfix(ok=self.ok, failed=self.failed, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def build_dataset(
    opts: argparse.Namespace, urls: dict[str, str], models: dict[str, ModelInfo]
) -> tuple[Dataset, list[str]]:
    """The prompts, built with the first target's tokenizer: every target gets the same text (and images,
    all encoded here, before the run); and the words they are made of, one token each. Speech needs no
    tokenizer: it is built from characters (no words)."""
    if opts.dataset == "tts":
        return tts.from_options(opts, opts.seed), []
    first = next(iter(urls))
    with httpx.Client(timeout=60) as client:
        words = single_token_words(client, urls[first], models[first].name)
    if opts.dataset == "long":
        contexts = [m.max_model_len for m in models.values() if m.max_model_len is not None]
        if not contexts:
            raise SystemExit("--dataset long needs max_model_len in the targets' GET /v1/models")
        input_lens = long_input_lens(min(contexts), opts.output_len, opts.long_fractions)
        return WordDataset(tuple(words), input_lens, opts.output_len, opts.seed), words
    text = WordDataset(tuple(words), (opts.input_len,), opts.output_len, opts.seed)
    if opts.dataset == "random":
        return text, words
    return images.from_options(opts, text), words


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark; writes results.json, results.md and plots; returns the results document."""
    opts = parse_args(argv)
    out: Path = opts.out or Path("results/bench") / time.strftime("%Y%m%d-%H%M%S")
    levels = tuple(map(float, opts.concurrency or opts.request_rate or [4]))
    workload = Workload(
        mode="rate" if opts.request_rate else "concurrency", levels=levels, duration_s=opts.duration,
        rounds=opts.rounds, endpoint=opts.endpoint, max_concurrency=opts.max_concurrency, warmup=opts.warmup,
        health_interval_s=opts.health_interval, request_timeout_s=opts.request_timeout,
        rotate=not opts.no_rotate, seed=opts.seed, honor_retry_after=opts.honor_retry_after,
        # Pooled over the rounds, each cell's share makes the target and level reach --min-streams.
        min_ok=-(-opts.min_streams // opts.rounds) if opts.endpoint == "speech" else 0,
        max_duration_s=opts.max_duration, rest_s=opts.rest, text_probe_interval_s=opts.text_probe_interval,
    )  # fmt: skip
    pids: dict[str, int] = {}
    with targets.started(opts.start, out, pids) as started:
        urls: dict[str, str] = {**started, **opts.urls}
        with httpx.Client(timeout=60) as client:
            models = {name: fetch_model(client, url, CAPABILITY.get(opts.dataset)) for name, url in urls.items()}
        dataset, words = build_dataset(opts, urls, models)
        probe_prompts = (
            text_probe.dataset(words, opts.text_probe_len, opts.seed, opts.text_probe_priority)
            if opts.text_probe_interval
            else None
        )
        meter, unmeasured = cpu.meter(pids, opts.urls) if not opts.no_cpu else (None, [])
        if unmeasured:
            print(f"CPU not measured for {', '.join(unmeasured)}: no process of this machine listens on its port")
        bar = Bar(len(levels) * opts.rounds * len(urls), disable=opts.no_progress)
        try:
            runner = Runner(
                [Target(name, url, models[name].name) for name, url in urls.items()], dataset, workload, bar, meter,
                probe_prompts,
            )  # fmt: skip
            cells = asyncio.run(runner.run())
            rest = runner.rest
        finally:
            bar.close()
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()}
    config["input_lens"] = list(dataset.input_lens)
    scopes = meter.scopes if meter else {}
    target_info = {name: {"url": urls[name], "model": m.name, "max_model_len": m.max_model_len,
                          "cpu_scope": scopes[name].describe() if name in scopes else None}
                   for name, m in models.items()}  # fmt: skip
    document = report.build(cells, workload, target_info, config, opts.slos_ms, opts.underrun_threshold_ms, rest)
    results: dict[str, Any] = report.jsonable(document)
    results.update(run_meta("load.bench", list(argv) if argv is not None else None), kind="bench", label=opts.label,
                   handicapped=opts.handicapped)  # fmt: skip
    report.write(results, out)
    if not opts.no_plots:
        from load.bench import plots  # matplotlib takes ~1 s to import: only when plotting

        plots.write(results, out)
    print(report.markdown(results))
    print(f"results in {out}/")
    return results
