"""Short text requests beside the load, one at a time: does a small request still get its first token
soon while the load (images, long prompts) keeps the server's CPU busy?

This is the question the stage split is for. In a single-process server, image decoding and
processing run on the API server's event loop, and a short text request that arrives meanwhile waits
behind them; in the graph they run in the multimodal stage's processes. `/health` shows a stalled
loop; this shows what a user of the same model waits for. Each probe is a distinct prompt (no prefix
cache hit) of `--text-probe-len` tokens asking for one token, sent to the load's model and endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from typing import Any

import httpx

from load.bench.client import Endpoint, RequestRecord, send
from load.bench.datasets import WordDataset
from load.bench.metrics import stages_ms, ttfts, without_text
from load.stats import summary_ms

# The probes' prompts are seeded apart from the load's, so no probe shares a prefix with a load prompt.
SEED_OFFSET = 1_000_003


def dataset(words: Sequence[str], input_len: int, seed: int, priority: int = 0) -> WordDataset:
    """The probes' prompts: `input_len` tokens each, one token out, sent with `priority` (vLLM's request
    priority, lower first, for servers whose engine schedules by it) unless 0."""
    return WordDataset(tuple(words), (input_len,), 1, seed + SEED_OFFSET, priority)


async def probe(
    client: httpx.AsyncClient, base_url: str, endpoint: Endpoint, model: str, prompts: WordDataset,
    first_index: int, stop: asyncio.Event, interval_s: float,
) -> list[RequestRecord]:  # fmt: skip
    """Probes started every `interval_s`, one at a time, until `stop` is set; prompt `first_index` first.
    As with `/health` probes, a slow one delays the next instead of piling up."""
    records: list[RequestRecord] = []
    next_at = time.perf_counter()
    while not stop.is_set():
        records.append(await send(client, base_url, endpoint, model, prompts.prompt(first_index + len(records))))
        next_at = max(next_at + interval_s, time.perf_counter())
        with contextlib.suppress(TimeoutError):  # the interval passed: next probe; else the load is over
            await asyncio.wait_for(stop.wait(), next_at - time.perf_counter())
    return records


def summarize(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """TTFT in ms of the probes that were served and the stage times their server reported, and how many
    failed; None when none was sent."""
    if not records:
        return None
    good = [r for r in records if r.ok]
    return {"sent": len(records), "failed": len(records) - len(good), "without_text": without_text(good),
            "ttft_ms": summary_ms(ttfts(good)), "stage_ms": stages_ms(good)}  # fmt: skip


def markdown(level_name: str, rows: Sequence[tuple[str, str, dict[str, Any]]], config: dict[str, Any]) -> list[str]:
    """The probes' table (how they were sent: the run's `config`); nothing without probes."""
    probed = [(level, name, m["text_probe"]) for level, name, m in rows if m.get("text_probe")]
    if not probed:
        return []
    interval_s, priority = config.get("text_probe_interval"), config.get("text_probe_priority")
    every = f"every {interval_s:g} s" if interval_s else "at intervals"
    every += f", priority {priority}" if priority else ""
    lines = [
        "",
        f"Short text requests beside the load (one at a time, {every}, one token out; TTFT in ms): what a user "
        "of the same model waits for while the load keeps the server busy",
        "",
        f"| target | {level_name} | sent | failed | no text | TTFT mean | p50 | p95 | p99 | max | server stages p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for level, name, p in probed:
        t = p["ttft_ms"]
        lines.append(
            f"| {name} | {level} | {p['sent']} | {p['failed']} | {p.get('without_text', '-')} | "
            + " | ".join(_ms(t[k]) for k in ("mean", "p50", "p95", "p99", "max"))
            + " | "
            + (", ".join(f"{stage} {_ms(s['p50'])}" for stage, s in p.get("stage_ms", {}).items()) or "-")
            + " |"
        )
    return lines


def _ms(value: float | None) -> str:
    # None in a result file, NaN before it is written: no probe was served.
    return "-" if value is None or math.isnan(value) else f"{value:,.1f}"
