"""Tokenizer throughput three ways, on the same chat prompts, against the physical reference.

Each prompt is one user message of `--input-len` random single-token words (the bench's words), rendered
with the model's chat template and tokenized without special tokens, as a chat request is.
- reference: the model's HF tokenizer called directly in this process, one thread: what tokenizing costs.
- stage: `TokenizerStage.tokenize` in this process with `--threads` threads (default: the config's),
  the class the tokenizer deployment runs, all prompts submitted at once.
- graph (with `--url`): `POST {url}/tokenize` with `messages`, which the ingress forwards to the tokenizer
  deployment, from `--concurrency` clients.
Each of `--rounds` rounds runs the three in turn over all prompts, after a few unmeasured ones; rounds pool.
`python -m load.tokenizer_throughput --app tiny-chat --url http://127.0.0.1:8000 --out results/tokenizer.json`
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from load.bench.datasets import TEXT_INPUT_LEN, fetch_model, positive_int
from load.offline import word_dataset, write_result
from load.serve_config import DEFAULT_CONFIG, load_in_process
from serve_app.messages import ChatPrompt, TokenizeRequest
from serve_app.stages.tokenizer import TokenizerStage, load_hf_tokenizer

Messages = list[dict[str, str]]
WARMUP = 8


@dataclass
class Measured:
    """Prompts tokenized, their tokens and the seconds it took, summed over rounds."""

    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, prompts: int, tokens: int, seconds: float) -> None:
        self.prompts += prompts
        self.tokens += tokens
        self.seconds += seconds


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m load.tokenizer_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--app", default="tiny-chat", help="the model of --config whose tokenizer is measured")
    parser.add_argument("--prompts", type=positive_int, default=1000, help="prompts per round")
    parser.add_argument("--input-len", type=positive_int, default=TEXT_INPUT_LEN, help="words per message")
    parser.add_argument("--threads", type=positive_int, default=None, help="stage threads (default: the config's)")
    parser.add_argument("--url", default=None, help="the graph, e.g. http://127.0.0.1:8000; without it no graph run")
    parser.add_argument("--concurrency", type=positive_int, default=16, help="graph: clients in flight")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="", help="what is special about this run, shown in the report")
    parser.add_argument("--out", default=None, help="result JSON file")
    opts = parser.parse_args(argv)
    if opts.url is not None:
        if not opts.url.startswith(("http://", "https://")):
            parser.error(f"--url {opts.url}: expected http(s)://HOST:PORT")
        opts.url = opts.url.rstrip("/")
    return opts


def conversations(tokenizer: Any, model: str, count: int, input_len: int, seed: int = 0) -> list[Messages]:
    """`count` chats of one user message of `input_len` words, as the bench's chat requests send them."""
    dataset = word_dataset(tokenizer, model, input_len, output_len=1, seed=seed)
    return [[{"role": "user", "content": dataset.prompt(i).text}] for i in range(count)]


def reference(tokenizer: Any, chats: Sequence[Messages]) -> tuple[int, float]:
    """Tokens of all chats, and seconds, with the tokenizer stage's steps and nothing else."""
    start = time.perf_counter()
    tokens = 0
    for messages in chats:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        tokens += len(tokenizer.encode(text, add_special_tokens=False))
    return tokens, time.perf_counter() - start


async def staged(stage: TokenizerStage, chats: Sequence[Messages]) -> tuple[int, float]:
    # What `/tokenize` asks of the stage for `messages`.
    requests = [TokenizeRequest(ChatPrompt(list(m)), add_special_tokens=False, check_context=False) for m in chats]
    start = time.perf_counter()
    results = await asyncio.gather(*(stage.tokenize(r) for r in requests))
    return sum(len(r.token_ids) for r in results), time.perf_counter() - start


def check_graph(url: str, model: str) -> None:
    """Fail now, clearly, if `url` is not a running graph serving `model`."""
    try:
        with httpx.Client(timeout=10) as client:
            served = fetch_model(client, url).name
    except httpx.HTTPError as exc:
        raise SystemExit(
            f"--url {url}: no graph answers GET /v1/models ({type(exc).__name__}: {exc}). "
            "Start one (make serve), or leave out --url to measure the in-process paths only."
        ) from exc
    if served != model:
        raise SystemExit(f"--url {url} serves {served!r}, not the config's {model!r}: not the same tokenizer")


async def over_http(client: httpx.AsyncClient, chats: Sequence[Messages], concurrency: int) -> tuple[int, float]:
    """All chats through `POST /tokenize`, `concurrency` at a time; `client` has the graph as base_url."""
    pending = iter(chats)  # shared by the workers: each chat is sent once
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        for messages in pending:
            response = await client.post("/tokenize", json={"messages": messages})
            if response.status_code != 200:
                raise SystemExit(f"POST {client.base_url}/tokenize: HTTP {response.status_code}: {response.text}")
            tokens += int(response.json()["count"])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens, time.perf_counter() - start


def build_result(opts: argparse.Namespace, model: str, threads: int, paths: dict[str, Measured]) -> dict[str, Any]:
    """The result document, less run_meta; `paths` has "reference", "stage" and maybe "graph"."""
    how = {
        "reference": "HF tokenizer in this process, 1 thread",
        "stage": f"TokenizerStage.tokenize in this process, {threads} threads",
        "graph": f"POST {opts.url}/tokenize, {opts.concurrency} clients",
    }
    ref = paths["reference"]
    return {
        "kind": "tokenizer_throughput",
        "label": opts.label,
        "config": opts.config,
        "app": opts.app,
        "model": model,
        "prompts": opts.prompts,
        "rounds": opts.rounds,
        "input_len": opts.input_len,
        "tokens_per_prompt": ref.tokens / ref.prompts,
        "threads": threads,
        "url": opts.url,
        "concurrency": opts.concurrency if opts.url else None,
        "paths": {
            name: {
                "how": how[name],
                "prompts": m.prompts,
                "tokens": m.tokens,
                "seconds": m.seconds,
                "prompts_per_s": m.prompts / m.seconds,
                "tokens_per_s": m.tokens / m.seconds,
                # Same prompts on every path, so the prompts/s and tokens/s ratios are one number.
                "vs_reference": (m.prompts / m.seconds) / (ref.prompts / ref.seconds),
            }
            for name, m in paths.items()
        },
    }


async def measure(opts: argparse.Namespace) -> dict[str, Any]:
    args = load_in_process(opts.config, opts.app)
    factory = load_hf_tokenizer(args.model.tokenizer_path, args.model.trust_remote_code)
    tokenizer = factory()
    threads = opts.threads or args.tokenizer.threads
    chats = conversations(tokenizer, args.model.name, opts.prompts + WARMUP, opts.input_len, opts.seed)
    warmup, chats = chats[:WARMUP], chats[WARMUP:]
    if opts.url:
        check_graph(opts.url, args.model.name)
    stage = TokenizerStage(factory, args.model.max_model_len, threads)
    paths = {name: Measured() for name in ("reference", "stage", *(["graph"] if opts.url else []))}
    try:
        async with httpx.AsyncClient(base_url=opts.url or "", timeout=60) as client:
            reference(tokenizer, warmup)
            # Every copy of the stage's tokenizers warms up, not only the first.
            await staged(stage, warmup * threads)
            if opts.url:
                await over_http(client, warmup, opts.concurrency)
            for _ in range(opts.rounds):
                runs = {"reference": reference(tokenizer, chats), "stage": await staged(stage, chats)}
                if opts.url:
                    runs["graph"] = await over_http(client, chats, opts.concurrency)
                expected = runs["reference"][0]
                for name, (tokens, seconds) in runs.items():
                    if tokens != expected:
                        raise SystemExit(f"{name}: {tokens} tokens, the reference {expected}: not the same work")
                    paths[name].add(len(chats), tokens, seconds)
    finally:
        stage.close()
    return build_result(opts, args.model.name, threads, paths)


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    write_result(asyncio.run(measure(opts)), "load.tokenizer_throughput", argv, opts.out)


if __name__ == "__main__":
    main()
