"""Soak: hours-long-style mixed traffic against the default config's three models, in time windows.

  python -m load.soak --url http://127.0.0.1:8000 --rate text=4 image=1 speech=0.2 --duration 600 --window 60

Kinds, each a Poisson (open-loop) stream at its own --rate, with load.bench's requests: `text`
(streaming chat, --input-len tokens in, --output-len out), `image` (chat with images, the bench's image
options) and `speech` (streamed PCM from /v1/audio/speech), all at URL/v1: each kind's model is the
first that `GET /v1/models` lists with the capability it needs (vision, speech), text the first.
Each window (by the time a request was sent) reports, per kind: requests, errors (every request that
did not succeed, a 503 included: at a sustainable rate nothing should be refused), TTFT (TTFA for
speech) and E2EL p50 / p99 of the successes; and, per stage, RSS (load/rss.py) at the window's start
and end, and its peak. The report sets the first window against the last. Give --capacity per kind
(req/s, from `python -m load.overload --capacity-only`) to have the planned utilization stated:
the sum over kinds of rate / capacity, e.g. 0.7 for 70 %.

Writes results.json and results.md under --out (default results/soak/<time>).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from load import outcomes, rss
from load.bench import images, report, tts
from load.bench.client import RequestRecord, send
from load.bench.datasets import (
    CAPABILITY,
    IMAGE_TEXT_LEN,
    TEXT_INPUT_LEN,
    Dataset,
    Prompt,
    WordDataset,
    fetch_model,
    positive_int,
    single_token_words,
)
from load.bench.health import loop_lag
from load.bench.metrics import summarize_ms, ttfts, without_text
from load.bench.runner import SendNext, arrival_offsets, open_loop
from load.stats import fmt_num

# Kind -> the default config's route prefix of its app.
KINDS = ("text", "image", "speech")


def kind_values(items: Sequence[str], option: str) -> dict[str, float]:
    """`["text=4", "speech=0.5"]` -> `{"text": 4.0, "speech": 0.5}`; kinds from KINDS, values > 0."""
    values: dict[str, float] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or kind not in KINDS:
            raise ValueError(f"{option} {item}: expected KIND=REQ_PER_S with KIND one of {', '.join(KINDS)}")
        try:
            values[kind] = float(value)
        except ValueError:
            raise ValueError(f"{option} {item}: {value!r} is not a number") from None
        if not values[kind] > 0:
            raise ValueError(f"{option} {item}: the rate must be positive")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server of the default config (its 3 models)")
    p.add_argument("--rate", nargs="+", required=True, metavar="KIND=REQ_PER_S", help="kinds: text, image, speech")
    p.add_argument("--capacity", nargs="+", default=[], metavar="KIND=REQ_PER_S", help="to state the utilization")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals")
    p.add_argument("--window", type=float, default=60.0, help="seconds per reporting window")
    p.add_argument("--input-len", type=positive_int, default=TEXT_INPUT_LEN, help="text: prompt tokens")
    p.add_argument("--image-text-len", type=positive_int, default=IMAGE_TEXT_LEN, help="image: text tokens")
    p.add_argument("--output-len", type=positive_int, default=32, help="text and image: output tokens")
    images.add_options(p)
    tts.add_options(p)
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds without a byte that count as a hang")
    p.add_argument("--rss-interval", type=float, default=1.0, help="seconds between RSS samples")
    p.add_argument("--rss-root-pid", type=int, help="count only processes below this one (default: all Serve's)")
    p.add_argument(
        "--honor-retry-after",
        action="store_true",
        help=f"a refused request (503/429 + Retry-After) waits and is sent again, {MAX_ATTEMPTS} attempts "
        "in all, as the OpenAI SDK does; its latency counts from the first attempt",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--label", default="", help="what is special about this run, for the report")
    opts = p.parse_args(argv)
    try:
        opts.rates = kind_values(opts.rate, "--rate")
        opts.capacities = kind_values(opts.capacity, "--capacity")
    except ValueError as exc:
        p.error(str(exc))
    if not (opts.duration > 0 and opts.window > 0 and opts.request_timeout > 0 and opts.rss_interval > 0):
        p.error("--duration, --window, --request-timeout and --rss-interval must be positive")
    if missing := set(opts.capacities) and set(opts.rates) - set(opts.capacities):
        p.error(f"--capacity: give every kind of --rate, missing {', '.join(sorted(missing))}")
    opts.url = opts.url.rstrip("/")
    return opts


@dataclass(frozen=True)
class Stream:
    """One kind's traffic: where it goes, what it sends."""

    kind: str
    url: str
    model: str
    dataset: Dataset


def streams(opts: argparse.Namespace) -> list[Stream]:
    """The datasets of the kinds with a rate, built before the run (images are encoded here)."""
    built = []
    with httpx.Client(timeout=60) as client:
        for kind in opts.rates:
            url = opts.url
            model = fetch_model(client, url, CAPABILITY.get(kind)).name
            dataset: Dataset
            if kind == "speech":
                dataset = tts.from_options(opts, opts.seed)
            else:
                words = tuple(single_token_words(client, url, model))
                length = opts.input_len if kind == "text" else opts.image_text_len
                dataset = WordDataset(words, (length,), opts.output_len, opts.seed)
                if kind == "image":
                    dataset = images.from_options(opts, dataset)
            built.append(Stream(kind, url, model, dataset))
    return built


# A client that honours Retry-After, as the OpenAI SDK does (it retries 429 and 503 twice by default).
MAX_ATTEMPTS = 3


def is_retryable(record: RequestRecord) -> bool:
    return outcomes.outcome(record) == outcomes.REJECTED and record.retry_after_s is not None


def since(record: RequestRecord, first_sent: float) -> RequestRecord:
    """`record` with its times counted from `first_sent`, the first attempt's send: waits and refused
    attempts count in the latency a retrying client sees."""
    shift = record.sent_at - first_sent
    if shift:
        record.sent_at = first_sent
        record.content_times = [t + shift for t in record.content_times]
        record.latency = None if record.latency is None else record.latency + shift
    return record


async def _lag_clock(stop: asyncio.Event, lags: list[tuple[float, float]]) -> None:
    """The bench's loop-lag sampler in one-second slices, each kept as (its end, its worst lag), so that
    a window can tell whether the client stalled in it."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        slice_done = asyncio.Event()
        loop.call_later(1.0, slice_done.set)
        lags.append((time.perf_counter(), max(await loop_lag(slice_done), default=0.0)))


async def _report_progress(stop: asyncio.Event, t0: float, window_s: float, counts: dict[str, list[int]]) -> None:
    """One line per window while the run goes on: requests answered and failed so far, per kind."""
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), window_s)
        done = ", ".join(f"{kind} {ok + failed} ({failed} failed)" for kind, (ok, failed) in counts.items())
        print(f"[{time.perf_counter() - t0:6.0f} s] {done}", flush=True)


@dataclass(frozen=True)
class Run:
    """The start (perf_counter), each kind's records, the client's loop lag as (time, worst lag of the
    second before), and each kind's retried refusals (--honor-retry-after)."""

    t0: float
    records: dict[str, list[RequestRecord]]
    lags: list[tuple[float, float]]
    retries: dict[str, int]


async def run(opts: argparse.Namespace, kinds: Sequence[Stream]) -> Run:
    """All kinds at once, each on its own Poisson arrivals."""
    lags: list[tuple[float, float]] = []
    counts = {s.kind: [0, 0] for s in kinds}
    retries = dict.fromkeys(opts.rates, 0)
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=opts.request_timeout, limits=limits) as client:

        def sender(stream: Stream) -> SendNext:
            index = itertools.count()

            async def send_once(prompt: Prompt) -> RequestRecord:
                if stream.kind == "speech":
                    return await tts.send(client, stream.url, stream.model, prompt)
                return await send(client, stream.url, "chat", stream.model, prompt)

            async def send_next() -> RequestRecord:
                prompt = stream.dataset.prompt(next(index))
                record = await send_once(prompt)
                first_sent, attempts = record.sent_at, 1
                while opts.honor_retry_after and attempts < MAX_ATTEMPTS and is_retryable(record):
                    assert record.retry_after_s is not None  # is_retryable checked it
                    await asyncio.sleep(record.retry_after_s)
                    record, attempts = await send_once(prompt), attempts + 1
                    retries[stream.kind] += 1
                counts[stream.kind][not record.ok] += 1
                return since(record, first_sent)

            return send_next

        t0 = time.perf_counter()
        watchers = [asyncio.create_task(_lag_clock(stop, lags)),
                    asyncio.create_task(_report_progress(stop, t0, opts.window, counts))]  # fmt: skip
        loads = []
        for s in kinds:
            arrivals = arrival_offsets(opts.rates[s.kind], opts.duration, random.Random(f"{opts.seed}:{s.kind}"))
            loads.append(open_loop(sender(s), arrivals, None))
        done = await asyncio.gather(*loads)
        stop.set()
        await asyncio.gather(*watchers)
    return Run(t0, {s.kind: records for s, records in zip(kinds, done, strict=True)}, lags, retries)


def _kind_window(kind: str, records: Sequence[RequestRecord]) -> dict[str, Any]:
    good = [r for r in records if r.ok]
    acc = outcomes.account(records)
    first = summarize_ms(ttfts(good))
    e2el = summarize_ms([r.latency for r in good if r.latency is not None])
    return {
        "requests": acc.sent,
        "errors": acc.sent - acc.succeeded,
        "error_kinds": {**acc.errors, **({outcomes.REJECTED: acc.rejected} if acc.rejected else {})},
        # Speech's first chunk is audio: TTFA, computed as TTFT is.
        ("ttfa_ms" if kind == "speech" else "ttft_ms"): {"p50": first["p50"], "p99": first["p99"]},
        "e2el_ms": {"p50": e2el["p50"], "p99": e2el["p99"]},
    }


def windows(
    t0: float, duration_s: float, window_s: float, records: dict[str, list[RequestRecord]],
    samples: Sequence[rss.RssSample], lags: Sequence[tuple[float, float]],
) -> list[dict[str, Any]]:  # fmt: skip
    """Per window [t0 + i * window_s, t0 + (i + 1) * window_s): each kind's requests sent in it, the RSS
    samples taken in it, and the client's worst loop lag in it (ms). The last window may be shorter, and
    takes the requests sent after the end too: one due just before it may leave a little late."""
    result = []
    count = math.ceil(duration_s / window_s - 1e-9)
    for i in range(count):
        start, end = t0 + i * window_s, t0 + min((i + 1) * window_s, duration_s)
        sent_before = end if i < count - 1 else math.inf
        result.append({
            "start_s": start - t0,
            "end_s": end - t0,
            "kinds": {kind: _kind_window(kind, [r for r in rs if start <= r.sent_at < sent_before])
                      for kind, rs in records.items()},
            "rss": rss.summarize(samples, start, end),
            "client_loop_lag_max_ms": max((lag * 1000 for at, lag in lags if start <= at < end), default=None),
        })  # fmt: skip
    return result


def error_list(t0: float, records: dict[str, list[RequestRecord]], most: int = 50) -> list[str]:
    """The first `most` failed requests, in the order they were sent: kind, when, what went wrong."""
    failed = sorted((r.sent_at, kind, r) for kind, rs in records.items() for r in rs if not r.ok)
    return [f"{kind} at {at - t0:.1f} s: {outcomes.outcome(r)}: {r.detail}" for at, kind, r in failed[:most]]


def build(
    opts: argparse.Namespace, t0: float, records: dict[str, list[RequestRecord]], samples: Sequence[rss.RssSample],
    lags: Sequence[tuple[float, float]], retries: dict[str, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The results document; `retries`: refusals that a client honouring Retry-After sent again, per kind."""
    utilization = sum(rate / opts.capacities[kind] for kind, rate in opts.rates.items()) if opts.capacities else None
    errors = sum(not r.ok for rs in records.values() for r in rs)
    document = {
        "kind": "soak",
        "rates": opts.rates,
        "capacities": opts.capacities,
        "utilization": utilization,
        "duration_s": opts.duration,
        "window_s": opts.window,
        "requests": {kind: len(rs) for kind, rs in records.items()},
        "errors": errors,
        "without_text": {kind: without_text(rs) for kind, rs in records.items()},
        "retries": retries or {},
        "error_list": error_list(t0, records),
        "windows": windows(t0, opts.duration, opts.window, records, samples, lags),
        "rss_run": rss.summarize(samples),
    }
    return dict(report.jsonable(document))  # empty summaries' NaN becomes null, as in the JSON file


def _change(first: float | None, last: float | None) -> str:
    return "-" if first is None or last is None else f"{last - first:+,.1f}"


def _first_vs_last(first: dict[str, Any], last: dict[str, Any]) -> list[str]:
    lines = ["| kind | measure | first window | last window | change |", "|---|---|---:|---:|---:|"]
    for kind, a in first["kinds"].items():
        b = last["kinds"][kind]
        latency = "ttfa_ms" if "ttfa_ms" in a else "ttft_ms"
        lines += [
            f"| {kind} | {name} | {a[name]} | {b[name]} | {b[name] - a[name]:+} |" for name in ("requests", "errors")
        ]
        for name, key in ((latency.replace("_ms", "").upper(), latency), ("E2EL", "e2el_ms")):
            for q in ("p50", "p99"):
                x, y = a[key][q], b[key][q]
                lines.append(f"| {kind} | {name} {q} ms | {fmt_num(x)} | {fmt_num(y)} | {_change(x, y)} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    rates = ", ".join(f"{kind} {rate:g} req/s" for kind, rate in result["rates"].items())
    planned = f" (planned utilization {result['utilization']:.0%} of capacity)" if result["utilization"] else ""
    windows_ = result["windows"]
    lines = [
        f"Mixed Poisson traffic for {result['duration_s']:.0f} s: {rates}{planned}; windows of "
        f"{result['window_s']:.0f} s by send time. Errors: every request that did not succeed (503 included).",
        "",
        f"Errors: {result['errors']} of {sum(result['requests'].values())} requests"
        + ("" if result["errors"] else " (none)"),
    ]
    if retried := {kind: n for kind, n in result.get("retries", {}).items() if n}:
        counts = ", ".join(f"{kind} {n}" for kind, n in retried.items())
        lines[-1] += f"; refusals waited out (Retry-After) and sent again: {counts}"
    if silent := {kind: n for kind, n in result.get("without_text", {}).items() if n}:
        counts = ", ".join(f"{kind} {n}" for kind, n in silent.items())
        lines[-1] += f"; served streams whose tokens decode to no text (no TTFT): {counts}"
    lines += [f"- {line}" for line in result["error_list"]]
    if windows_:
        first, last = windows_[0], windows_[-1]
        lines += ["", "First window against the last", "", *_first_vs_last(first, last)]
        lines += ["", "RSS per stage, MiB: start of the first window, end of the last, peak over the run", "",
                  "| stage | first | last | change | peak |", "|---|---:|---:|---:|---:|"]  # fmt: skip
        for stage, run in result["rss_run"].items():
            a = first["rss"].get(stage, {}).get("start_mib")
            b = last["rss"].get(stage, {}).get("end_mib")
            peak = fmt_num(run["peak_mib"], 0)
            lines.append(f"| {stage} | {fmt_num(a, 0)} | {fmt_num(b, 0)} | {_change(a, b)} | {peak} |")
        lines += rss.mixed_clusters_warning(result["rss_run"])
        kinds = list(first["kinds"])
        lines += ["", "Per window: requests / errors / p99 TTFT (speech: TTFA) ms; RSS of all stages at its end", "",
                  "| window s | " + " | ".join(kinds) + " | RSS MiB | client lag max ms |",
                  "|---|" + "---:|" * (len(kinds) + 2)]  # fmt: skip
        for w in windows_:
            cells = []
            for kind in kinds:
                k = w["kinds"][kind]
                cells.append(f"{k['requests']} / {k['errors']} / {fmt_num(k.get('ttft_ms', k.get('ttfa_ms'))['p99'])}")
            total = sum(s["end_mib"] for s in w["rss"].values()) if w["rss"] else None
            lines.append(f"| {w['start_s']:.0f}-{w['end_s']:.0f} | " + " | ".join(cells)
                         + f" | {fmt_num(total, 0)} | {fmt_num(w['client_loop_lag_max_ms'])} |")  # fmt: skip
    lag = max((w["client_loop_lag_max_ms"] or 0.0 for w in windows_), default=0.0)
    if lag > report.STALLED_MS:
        lines += ["", f"**The client stalled** (event-loop lag up to {lag:.0f} ms): latencies then are inflated."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    opts = parse_args(argv)
    out: Path = opts.out or Path("results/soak") / time.strftime("%Y%m%d-%H%M%S")
    kinds = streams(opts)
    with rss.RssSampler(opts.rss_interval, opts.rss_root_pid) as sampler:
        done = asyncio.run(run(opts, kinds))
    results = build(opts, done.t0, done.records, sampler.samples, done.lags, done.retries)
    return report.save(results, opts, "load.soak", argv, out, markdown)


if __name__ == "__main__":
    main()
