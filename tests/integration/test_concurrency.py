"""Tokenization is exact under concurrency: many requests, mixed truncation, every count checked."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "parsing",
    "json",
    "and",
    "yaml",
    "files",
]


def expected_prompt_tokens(tokenizer: Any, text: str, truncate: int | None) -> int:
    n = len(tokenizer.encode(text))
    return n if truncate is None else min(n, truncate)


# Few enough for admission by work (15 s of the default config's rates for tiny-chat) to admit them all.
@pytest.mark.parametrize("concurrency", [48])
async def test_prompt_tokens_exact_with_mixed_truncation(aclient: Any, reference_tokenizer: Any,
                                                         concurrency: int) -> None:  # fmt: skip
    rng = random.Random(0)
    cases = []
    for _ in range(192):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 400)))
        truncate = rng.choice([None, None, 3, 17, 64, 250, 1000])
        cases.append((text, truncate))
    semaphore = asyncio.Semaphore(concurrency)

    async def one(text: str, truncate: int | None) -> int:
        extra = {} if truncate is None else {"truncate_prompt_tokens": truncate}
        async with semaphore:
            response = await aclient.completions.create(model="tiny-chat", prompt=text, max_tokens=1, extra_body=extra)
        return int(response.usage.prompt_tokens)

    got = await asyncio.gather(*(one(text, truncate) for text, truncate in cases))
    want = [expected_prompt_tokens(reference_tokenizer, text, truncate) for text, truncate in cases]
    wrong = [(i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert wrong == []
    assert len(set(want)) > 20  # the mix really exercised many different lengths
