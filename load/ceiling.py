"""The offline engine ceiling: the most the engine serves of the bench's text workload on this machine,
with no HTTP and no Ray, so the bench's graph and `vllm` numbers can be stated as fractions of it.

The engine is built in this process as the LLM stage builds it (`LLMStage.from_args` on the Serve
config's args, with the env vars the config gives its llm deployment) and driven through
`LLMStage.generate`, the code a graph's llm replica runs. The workload is the bench's text scenario:
`--requests` prompts of `--input-len` random single-token words, turned into token ids here by the
model's tokenizer (special tokens added, as `/v1/completions` adds them), each asking for exactly
`--output-len` tokens (greedy, or with `--sampling speech` as a speech model samples its audio codes;
`ignore_eos`), all submitted at once or `--concurrency` at a time.
`python -m load.ceiling --app tiny-chat --out results/ceiling.json` (256 x 256 in / 32 out)
`python -m load.ceiling --app tiny-orpheus --sampling speech --requests 4 --concurrency 2 --output-len 300`
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from load.bench.datasets import TEXT_INPUT_LEN, positive_int
from load.offline import word_dataset, write_result
from load.serve_config import DEFAULT_CONFIG, load_in_process
from serve_app.config import AppArgs
from serve_app.ingress.speech.serving import speech_sampling
from serve_app.messages import GenerateRequest, SamplingSpec
from serve_app.stages.llm import LLMStage
from serve_app.stages.tokenizer import load_hf_tokenizer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m load.ceiling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--app", default="tiny-chat", help="the model of --config whose engine is measured")
    parser.add_argument("--requests", type=positive_int, default=256)
    parser.add_argument("--input-len", type=positive_int, default=TEXT_INPUT_LEN, help="prompt words (= tokens)")
    parser.add_argument("--output-len", type=positive_int, default=32)
    parser.add_argument("--concurrency", type=positive_int, default=None, help="requests in flight (default: all)")
    parser.add_argument("--warmup", type=int, default=4, help="unmeasured requests before the run")
    parser.add_argument(
        "--sampling", choices=("greedy", "speech"), default="greedy",
        help="greedy, or a speech model's own `tts:` sampling (temperature, top_p, repetition_penalty)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="", help="what is special about this run, shown in the report")
    parser.add_argument("--out", default=None, help="result JSON file")
    return parser.parse_args(argv)


def sampling(args: AppArgs, how: str, output_len: int) -> SamplingSpec:
    """Exactly `output_len` tokens per request, sampled greedily or as the model's speech is."""
    if how == "greedy":
        return SamplingSpec(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    if args.tts is None:
        raise SystemExit(f"--sampling speech: {args.model.name} has no `tts:` settings")
    return replace(speech_sampling(args.tts, output_len), ignore_eos=True)


async def drive(stage: LLMStage, prompts: Sequence[list[int]], spec: SamplingSpec, concurrency: int) -> list[int]:
    """Every prompt through the engine, at most `concurrency` in flight; the output tokens of each."""
    gate = asyncio.Semaphore(concurrency)

    async def one(token_ids: list[int]) -> int:
        async with gate:
            generated = 0
            async for chunk in stage.generate(GenerateRequest(uuid.uuid4().hex, token_ids, spec)):
                generated += sum(len(delta.token_ids) for delta in chunk.deltas)
            return generated

    return list(await asyncio.gather(*(one(ids) for ids in prompts)))


def build_result(
    opts: argparse.Namespace, model: str, prompt_tokens: int, duration_s: float, output_tokens: int
) -> dict[str, Any]:
    """The result document, less run_meta: throughput of one timed run of `opts.requests` requests."""
    return {
        "kind": "ceiling",
        "label": opts.label,
        "config": opts.config,
        "app": opts.app,
        "model": model,
        "requests": opts.requests,
        "concurrency": opts.concurrency or opts.requests,
        "input_len": opts.input_len,
        "prompt_tokens": prompt_tokens,
        "output_len": opts.output_len,
        "sampling": opts.sampling,
        "duration_s": duration_s,
        "output_tokens": output_tokens,
        "request_throughput": opts.requests / duration_s,
        "output_throughput": output_tokens / duration_s,
    }


async def measure(opts: argparse.Namespace) -> dict[str, Any]:
    args = load_in_process(opts.config, opts.app)
    tokenizer = load_hf_tokenizer(args.model.tokenizer_path, args.model.trust_remote_code)()
    dataset = word_dataset(tokenizer, args.model.name, opts.input_len, opts.output_len, opts.seed)
    # Warmup prompts come after the measured ones in the dataset, so the prefix cache never holds a measured one.
    prompts = [
        list(tokenizer.encode(dataset.prompt(i).text, add_special_tokens=True))
        for i in range(opts.requests + opts.warmup)
    ]
    spec = sampling(args, opts.sampling, opts.output_len)
    stage = LLMStage.from_args(args)  # as the llm replica builds it (a talker: confined to its codebook)
    try:
        if opts.warmup:
            await drive(stage, prompts[opts.requests :], spec, opts.warmup)
        start = time.perf_counter()
        generated = await drive(stage, prompts[: opts.requests], spec, opts.concurrency or opts.requests)
        duration = time.perf_counter() - start
    finally:
        stage.shutdown()
    short = [n for n in generated if n != opts.output_len]
    if short:
        raise RuntimeError(f"{len(short)} requests did not generate {opts.output_len} tokens (e.g. {short[0]})")
    return build_result(opts, args.model.name, len(prompts[0]), duration, sum(generated))


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    write_result(asyncio.run(measure(opts)), "load.ceiling", argv, opts.out)


# vLLM starts its engine core in a subprocess, which imports this module again: only the parent measures.
if __name__ == "__main__":
    main()
