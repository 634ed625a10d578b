"""Top-p (nucleus) sampling on a CPU without sorting the vocabulary.

vLLM's CPU sampler applies top-p by sorting every row of logits at every step. For the talker that is
most of a decode step: sorting the tiny Orpheus model's 36,682 logits takes ~2 ms per sequence, while
the model's own forward pass takes ~2 ms (on the AVX-512 kind, greedy 428 tokens/s against 217 with
top-p for one sequence). A real Orpheus vocabulary is 156k tokens. With the talker's own sampling, one
sequence: 74.1 tokens/s here against 60.4 with the sort on the AVX2-only kind (docs/benchmarks.md,
sections 54-55).

The nucleus needs only its smallest kept probability. `histogram_top_p` finds it from a histogram of
the probabilities (binned by their float bits, which order as the floats do): every bin above the one
where the mass from the top crosses `p` is kept whole, every bin below it is dropped, and only the
tokens of that one bin are sorted. It keeps the same tokens as vLLM's sort (ties at the threshold are
all kept, where the sort's order keeps some). Rows that are not finite (NaN or +inf logits) keep
every token, as they would come out of the sort.

How it gets into the engine: the llm stage sets `ENV` before it starts the engine (`request`), and
`install`, a vLLM general plugin (entry point `vllm.general_plugins`, run in every process vLLM
spawns), replaces vLLM's `apply_top_k_top_p` in a CPU engine whose replica asked for it. A batch in
which any request has top-k (vLLM passes top-k per batch), or none has top-p, or logits other than
float32, still goes to vLLM's own function; so do processes that did not ask (a `vllm serve` in the
same environment).
"""

from __future__ import annotations

import logging
import os

import torch

from serve_app.engine_config import TopP

ENV = "SERVE_GRAPH_TOP_P"

# A non-negative float32 shifted right by 18 bits keeps its exponent and 5 mantissa bits: a bin spans
# ~3 % of a probability, and a probability <= 1.0 falls in one of 4065 bins.
_SHIFT = 18
_BINS = (0x3F800000 >> _SHIFT) + 1

logger = logging.getLogger("vllm.serve_graph.top_p")


def request(method: TopP) -> None:
    """In the llm replica, before the engine starts: which top-p its engine uses."""
    os.environ[ENV] = method


def histogram_top_p(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Mask with -inf, in place, the logits outside each row's nucleus of mass `p` (one per row):
    the tokens kept are those whose more probable tokens hold less than `p` together."""
    probs = logits.softmax(dim=-1)
    rows = probs.shape[0]
    # NaN's bit patterns fall outside 0.._BINS - 1, where they would land in another row's bins.
    bins = (probs.view(torch.int32) >> _SHIFT).clamp_(0, _BINS - 1)
    flat = (bins + torch.arange(rows).unsqueeze(1) * _BINS).flatten()
    mass = torch.bincount(flat, weights=probs.flatten(), minlength=rows * _BINS).view(rows, _BINS).double()
    above = mass.flip(1).cumsum(1).flip(1) - mass  # mass in the bins above each bin
    want = p.double().unsqueeze(1)
    # Rows with p = 1 keep every token (where rounding may leave the total mass a hair above or below 1).
    crossing = (above < want) & (above + mass >= want) & (want < 1)
    threshold = torch.zeros(rows, dtype=probs.dtype)
    for row in crossing.any(dim=1).nonzero().flatten().tolist():
        bin_ = int(crossing[row].nonzero()[-1])
        values = probs[row][bins[row] == bin_].sort(descending=True).values
        before = above[row, bin_] + values.double().cumsum(0) - values.double()
        threshold[row] = values[int((before < want[row]).sum()) - 1]
    return logits.masked_fill_(probs < threshold.unsqueeze(1), float("-inf"))


def install() -> None:
    """vLLM general plugin: in a CPU engine whose replica asked for `histogram`, top-p alone (no top-k)
    takes `histogram_top_p`; everything else stays with vLLM's function."""
    if os.environ.get(ENV) != "histogram":
        return
    from vllm.platforms import current_platform
    from vllm.v1.sample.ops import topk_topp_sampler as sampler

    if not current_platform.is_cpu() or getattr(sampler.apply_top_k_top_p, "_serve_graph", False):
        return
    original = sampler.apply_top_k_top_p

    def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        if p is None or k is not None or logits.dtype != torch.float32:  # the bins read float32 bits
            return original(logits, k, p)
        return histogram_top_p(logits, p)

    apply_top_k_top_p._serve_graph = True  # type: ignore[attr-defined]
    sampler.apply_top_k_top_p = apply_top_k_top_p
    logger.info("top-p without sorting the vocabulary (serve_app/stages/top_p.py) in pid %d", os.getpid())
