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
