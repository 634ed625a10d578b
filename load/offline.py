"""What the scripts that measure in this process, without a server (`load.ceiling`,
`load.tokenizer_throughput`), share: the bench's word prompts built with the model's own tokenizer
(load/bench/datasets.py), and the result file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from load.bench.datasets import WordDataset, keep_single_tokens
from load.meta import run_meta


def word_dataset(tokenizer: Any, model: str, input_len: int, output_len: int, seed: int = 0) -> WordDataset:
    """Prompts of `input_len` words, each one token for `tokenizer`, so each prompt is `input_len` tokens."""
    words = keep_single_tokens(lambda text: len(tokenizer.encode(text, add_special_tokens=False)), model)
    return WordDataset(tuple(words), (input_len,), output_len, seed)


def write_result(result: dict[str, Any], module: str, argv: Sequence[str] | None, out: str | None) -> None:
    """Print the result with run_meta (`argv` None: this process's command line); keep it in `out` too,
    for `load.benchmarks_page`."""
    text = json.dumps({**run_meta(module, None if argv is None else list(argv)), **result}, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
