"""N concurrent completions through the official `openai` client, retries included: what an application sees.

`load.burst` times the server's own answers on raw connections; this one counts what a caller of the
`openai` package ends up with, after the client's own retries of 429/503 answers (2 by default, honouring
Retry-After). Admission that counts requests instead of work failed some of 192 one-token completions
this way; every one should succeed when the engine clears them in seconds.

  python -m load.client_burst --target graph=http://127.0.0.1:8000 --target vllm=http://127.0.0.1:8001 \\
      --requests 192 --max-tokens 1 --out results/client-burst.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai

from load.bench.datasets import WORDS
from load.meta import run_meta, save_result
from load.stats import summary_ms


async def measure(
    url: str, model: str | None, n: int, max_tokens: int, words: int, http_client: Any = None
) -> dict[str, Any]:
    client = openai.AsyncOpenAI(
        base_url=f"{url.rstrip('/')}/v1", api_key="unused", timeout=600, http_client=http_client
    )
    if model is None:
        model = (await client.models.list()).data[0].id
    # A prompt of its own for each request, the same for every target: one prompt repeated would be
    # prefilled once and then found in the engine's prefix cache.
    prompts = [" ".join(random.Random(i).choices(WORDS, k=words)) for i in range(n)]

    async def one(prompt: str) -> tuple[str, float]:
        start = time.perf_counter()
        try:
            await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens)
            outcome = "ok"
        except openai.APIStatusError as exc:
            outcome = f"http_{exc.status_code}"
        except openai.APIError as exc:
            outcome = type(exc).__name__
        return outcome, time.perf_counter() - start

    start = time.perf_counter()
    try:
        results = await asyncio.gather(*(one(p) for p in prompts))
    finally:
        if http_client is None:  # a client given (tests: the in-process app) is its owner's to close
            await client.close()
    wall = time.perf_counter() - start
    return {
        "model": model,
        "requests": n,
        "max_tokens": max_tokens,
        "outcomes": dict(Counter(outcome for outcome, _ in results)),
        "latency_ms": summary_ms([seconds for _, seconds in results]),
        "wall_s": wall,
    }


def markdown(result: dict[str, Any]) -> str:
    """The run as a table: per target, the outcomes the client saw and how long its calls took."""
    lines = ["| target | model | requests | max_tokens | outcomes | latency p50 / p99 ms | wall s |",
             "|---|---|---:|---:|---|---:|---:|"]  # fmt: skip
    for row in result["rows"]:
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(row["outcomes"].items()))
        latency = row["latency_ms"]
        lines.append(
            f"| {row['target']} | {row['model']} | {row['requests']} | {row['max_tokens']} | {outcomes} "
            f"| {latency['p50']:.0f} / {latency['p99']:.0f} | {row['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load.client_burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--target", action="append", required=True, metavar="NAME=URL")
    p.add_argument("--model", default=None, help="default: the first of the target's /v1/models")
    p.add_argument("--requests", type=int, default=192)
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--input-words", type=int, default=256)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    rows = []
    for spec in opts.target:
        name, _, url = spec.partition("=")
        row = asyncio.run(measure(url, opts.model, opts.requests, opts.max_tokens, opts.input_words))
        rows.append({"target": name, **row})
        print(json.dumps(rows[-1]))
    save_result(opts.out, {**run_meta(), "kind": "client_burst", "rows": rows})


if __name__ == "__main__":
    main()
