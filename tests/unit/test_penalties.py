from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import cast

import pytest
import torch
from vllm.model_executor.layers.utils import apply_penalties as vllms_penalties
from vllm.v1.sample.ops import penalties as ops

from serve_app.stages import penalties
from serve_app.stages.penalties import sparse_penalties

VOCAB = 36682  # the tiny Orpheus model's


def batch(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (the first 8000 masked as `allowed_token_ids` masks them; a seen NaN and +inf), prompts and
    outputs padded with VOCAB as vLLM pads them, with repeated tokens, and penalties (of several rows, the
    last one's 1.0)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=generator) * 3
    logits[:, :8000] = float("-inf")
    prompt = torch.randint(0, VOCAB, (rows, 30), generator=generator)
    output = torch.randint(0, VOCAB, (rows, 300), generator=generator)
    prompt[0, -5:] = VOCAB
    output[-1, -40:] = VOCAB
    output[0, :20] = 8005
    output[0, 20:25] = 3  # a masked token, seen
    logits[0, output[0, 30]] = float("nan")
    logits[-1, prompt[-1, 0]] = float("inf")
    repetition = torch.rand(rows, generator=generator) + 0.5
    if rows > 1:
        repetition[-1] = 1.0
    return logits, prompt, output, repetition


def samplers() -> Callable[..., torch.Tensor]:
    """The `apply_penalties` vLLM's sampler calls."""
    return cast("Callable[..., torch.Tensor]", ops.__dict__[penalties.SAMPLERS_NAME])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_the_logits_come_out_as_vllms_bit_for_bit(rows: int) -> None:
    logits, prompt, output, repetition = batch(rows, seed=rows)
    zero = torch.zeros(rows)
    expected = vllms_penalties(logits.clone(), prompt, output, zero, zero, repetition)
    assert not same_bits(expected, logits)  # the penalties changed something
    assert same_bits(sparse_penalties(logits.clone(), prompt, output, repetition), expected)


def test_only_seen_tokens_change_and_an_empty_output_is_fine() -> None:
    logits, prompt, output, repetition = batch(1, seed=7)
    logits = logits.nan_to_num(nan=0.0)  # NaN != NaN would count as changed
    empty, zero = output[:, :0], torch.zeros(1)
    out = sparse_penalties(logits.clone(), prompt, empty, repetition)
    changed = set((out != logits).nonzero()[:, 1].tolist())
    assert changed <= set(prompt[0].tolist())
    assert len(changed) > 0
    assert same_bits(out, vllms_penalties(logits.clone(), prompt, empty, zero, zero, repetition))


def test_vllm_finds_the_plugin() -> None:
    assert "serve_app.stages.penalties:install" in {e.value for e in entry_points(group="vllm.general_plugins")}


@pytest.fixture
def vllms_function(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """vLLM's `apply_penalties` (as its sampler calls it) replaced by a recorder, restored after the test,
    and the plugin's environment variable cleared."""
    calls: list[str] = []

    def original(logits: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        calls.append("vllm")
        return logits

    monkeypatch.setattr(ops, penalties.SAMPLERS_NAME, original)
    # Set (not deleted) so that monkeypatch restores it: `penalties.request` writes os.environ itself.
    monkeypatch.setenv(penalties.ENV, "")
    return calls


@pytest.mark.parametrize("asked", [None, "dense"])
def test_unasked_the_plugin_leaves_vllm_alone(vllms_function: list[str], asked: str | None) -> None:
    if asked is not None:
        penalties.request("dense")
    before = samplers()
    penalties.install()
    assert samplers() is before


def test_asked_the_plugin_takes_repetition_penalties_alone(vllms_function: list[str]) -> None:
    penalties.request("sparse")
    penalties.install()
    installed = samplers()
    penalties.install()  # vLLM may load plugins twice in one process: installed once
    assert samplers() is installed
    logits, prompt, output, repetition = batch(2, seed=3)
    zero, some = torch.zeros(2), torch.tensor([0.0, 0.5])
    out = samplers()(logits.clone(), prompt, output, zero, zero, repetition)
    assert vllms_function == [] and not same_bits(out, logits)
    samplers()(logits, prompt, output, some, zero, repetition)
    samplers()(logits, prompt, output, zero, some, repetition)
    samplers()(logits, prompt, output, -zero, zero, repetition)  # vLLM's -= -0.0 turns -0.0 logits into +0.0
    samplers()(logits.bfloat16(), prompt, output, zero, zero, repetition)
    assert vllms_function == ["vllm"] * 4
