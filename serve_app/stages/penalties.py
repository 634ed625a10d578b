"""Repetition penalties on a CPU without a pass over the whole vocabulary.

vLLM (0.32) applies a batch's presence, frequency and repetition penalties with tables the size of the
vocabulary at every step: it counts the prompt's and the output's tokens into two zeroed int64 tables of
(sequences x vocabulary + 1), builds penalty and scaling tables of the same size, and multiplies every
logit. A talker samples with a repetition penalty alone (Orpheus: 1.1) over its 36,682-token vocabulary;
on the AVX2-only kind that took ~1.4 ms of its ~13.5 ms decode step (py-spy of its engine core, one
stream; docs/benchmarks-notes.md, stop 64). Only the logits of tokens a sequence has already seen change,
at most its prompt and output many: `sparse_penalties` gathers those, scales them by the same float32
arithmetic as vLLM (`logits *= where(logits > 0, 1 / penalty, penalty)`) and writes them back, so the
logits come out bit for bit as vLLM's. A batch with any presence or frequency penalty (or -0.0, which
vLLM's subtraction would turn a -0.0 logit into +0.0 with), or logits other than float32 (vLLM's sampler
passes float32), goes to vLLM's own function.

How it gets into the engine: as `top_p.py`'s does. The llm stage sets `ENV` before it starts the engine
(`request`), and `install`, a vLLM general plugin (entry point `vllm.general_plugins`, run in every
process vLLM spawns), replaces the `apply_penalties` that vLLM's sampler calls, in a CPU engine whose
replica asked for it; a `vllm serve` in the same environment keeps vLLM's.
"""

from __future__ import annotations

import logging
import os

import torch

from serve_app.engine_config import Penalties

ENV = "SERVE_GRAPH_PENALTIES"
SAMPLERS_NAME = "apply_penalties"

logger = logging.getLogger("vllm.serve_graph.penalties")


def request(method: Penalties) -> None:
    """In the llm replica, before the engine starts: how its engine applies penalties."""
    os.environ[ENV] = method


def sparse_penalties(
    logits: torch.Tensor, prompt_tokens: torch.Tensor, output_tokens: torch.Tensor, repetition_penalties: torch.Tensor
) -> torch.Tensor:
    """Apply each row's repetition penalty, in place, to the logits of the tokens in its prompt or output
    (both padded with the vocabulary's size, as vLLM pads them)."""
    rows, vocab = logits.shape
    tokens = torch.cat((prompt_tokens, output_tokens), dim=1)
    # The padding (`vocab`) is no token; vLLM replaces its -1 placeholders with it before this call, and a
    # negative id left over would index from the end and penalize a token never seen.
    seen = (tokens >= 0) & (tokens < vocab)
    row = torch.arange(rows).unsqueeze(1).expand_as(tokens)[seen]
    token = tokens[seen]
    # A token seen twice is gathered twice from the untouched logits and written twice with the same value.
    values = logits[row, token]
    penalty = repetition_penalties[row]
    logits[row, token] = values * torch.where(values > 0, 1.0 / penalty, penalty)
    return logits


def install() -> None:
    """vLLM general plugin: in a CPU engine whose replica asked for `sparse`, a batch with repetition
    penalties alone takes `sparse_penalties`; everything else stays with vLLM's function."""
    if os.environ.get(ENV) != "sparse":
        return
    from vllm.platforms import current_platform
    from vllm.v1.sample.ops import penalties as ops

    if not current_platform.is_cpu():
        return
    # vLLM's sampler calls the function by this name in that module, which imports it from elsewhere (so
    # mypy does not see it as that module's); a vLLM that renamed it keeps its own code, with a warning.
    original = ops.__dict__.get(SAMPLERS_NAME)
    if original is None:
        logger.warning("vLLM has no %s.%s: its own penalties stay", ops.__name__, SAMPLERS_NAME)
        return
    if getattr(original, "_serve_graph", False):
        return

    def apply_penalties(
        logits: torch.Tensor,
        prompt_tokens: torch.Tensor,
        output_tokens: torch.Tensor,
        presence_penalties: torch.Tensor,
        frequency_penalties: torch.Tensor,
        repetition_penalties: torch.Tensor,
    ) -> torch.Tensor:
        others = torch.cat((presence_penalties, frequency_penalties))
        if logits.dtype != torch.float32 or bool(((others != 0) | others.signbit()).any()):
            return original(  # type: ignore[no-any-return]
                logits, prompt_tokens, output_tokens, presence_penalties, frequency_penalties, repetition_penalties
            )
        return sparse_penalties(logits, prompt_tokens, output_tokens, repetition_penalties)

    apply_penalties._serve_graph = True  # type: ignore[attr-defined]
    setattr(ops, SAMPLERS_NAME, apply_penalties)
    logger.info("repetition penalties on seen tokens only (serve_app/stages/penalties.py) in pid %d", os.getpid())
