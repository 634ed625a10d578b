"""Latency the graph adds over calling the engine directly, measured side by side in one run.

Each round sends the same prompt three ways, interleaved so machine noise hits all alike:
the graph over HTTP (streaming chat), optionally another server (e.g. `load.baseline`), and the
engine itself in this process (`LLMStage` on an `AsyncLLM`, given the token ids). TTFT is request
sent -> first generated token; E2E is request sent -> last token. Added per token is the added time
of each token after the first, (added E2E - added TTFT) / (tokens - 1): the first token's is the
added TTFT, reported on its own.
`python -m load.overhead --target graph=http://127.0.0.1:8000 --rounds 40`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import httpx

from load.bench.client import send
from load.bench.datasets import Prompt
from load.meta import run_meta, save_result
from load.serve_config import DEFAULT_CONFIG, load_in_process
from load.stats import summary_ms
from serve_app.messages import ChatPrompt, GenerateRequest, SamplingSpec, TokenizeRequest
from serve_app.stages.llm import LLMStage
from serve_app.stages.tokenizer import TokenizerStage

QUESTION = "Summarize what a serving graph does, in one short paragraph."
MESSAGES = [{"role": "user", "content": QUESTION}]


def added_per_token_ms(added_e2e_ms: float, added_ttft_ms: float, tokens: int) -> float:
    """What a target adds to each streamed token after the first. Dividing the added E2E by every token
    would spread the added TTFT over them too, and count it twice next to the added TTFT."""
    if tokens < 2:
        raise ValueError(f"added time per token needs at least 2 tokens, got {tokens}")
    return (added_e2e_ms - added_ttft_ms) / (tokens - 1)


async def over_http(client: httpx.AsyncClient, url: str, model: str, prompt: Prompt) -> tuple[float, float]:
    record = await send(client, url, "chat", model, prompt)
    if not record.ok or record.latency is None:
        raise RuntimeError(f"{url}: {record.error}: {record.detail}")
    return record.content_times[0], record.latency


async def direct(stage: LLMStage, token_ids: list[int], max_tokens: int) -> tuple[float, float]:
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    ttft = None
    async for chunk in stage.generate(GenerateRequest(uuid.uuid4().hex, token_ids, spec)):
        if ttft is None and any(d.token_ids for d in chunk.deltas):
            ttft = time.perf_counter() - start
    assert ttft is not None
    return ttft, time.perf_counter() - start


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    args = load_in_process(opts.config)
    tokenizer = TokenizerStage.from_args(args)
    token_ids = tokenizer.tokenize_sync(TokenizeRequest(ChatPrompt(MESSAGES), add_special_tokens=False)).token_ids
    prompt = Prompt(QUESTION, input_len=len(token_ids), output_len=opts.max_tokens)
    stage = LLMStage.from_args(args)
    targets = dict(t.split("=", 1) for t in opts.target)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in [*targets, "engine_direct"]}
    async with httpx.AsyncClient(timeout=120) as client:
        for round_ in range(opts.rounds + opts.warmup):
            for name, url in targets.items():
                result = await over_http(client, url, args.model.name, prompt)
                if round_ >= opts.warmup:
                    samples[name].append(result)
            result = await direct(stage, token_ids, opts.max_tokens)
            if round_ >= opts.warmup:
                samples["engine_direct"].append(result)
    stage.shutdown()
    report: dict[str, Any] = {
        **run_meta(),
        "kind": "overhead",
        "label": opts.label,
        "rounds": opts.rounds,
        "max_tokens": opts.max_tokens,
        "prompt_tokens": len(token_ids),
        "targets": {},
    }
    for name, pairs in samples.items():
        report["targets"][name] = {"ttft_ms": summary_ms([p[0] for p in pairs]),
                                   "e2e_ms": summary_ms([p[1] for p in pairs])}  # fmt: skip
    base = report["targets"]["engine_direct"]
    for name in targets:
        t = report["targets"][name]
        t["added_ttft_ms_p50"] = t["ttft_ms"]["p50"] - base["ttft_ms"]["p50"]
        t["added_e2e_ms_p50"] = t["e2e_ms"]["p50"] - base["e2e_ms"]["p50"]
        t["added_per_token_ms_p50"] = added_per_token_ms(t["added_e2e_ms_p50"], t["added_ttft_ms_p50"], opts.max_tokens)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", action="append", required=True, help="name=url, repeatable")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="engine args for the direct engine")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32, help="at least 2: the first token's time is TTFT")
    parser.add_argument("--label", default="", help="what is special about this run, shown in the report")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    if opts.max_tokens < 2:
        parser.error("--max-tokens must be at least 2")
    report = asyncio.run(run(opts))
    print(json.dumps(report, indent=2))
    save_result(opts.out, report)


if __name__ == "__main__":
    main()
