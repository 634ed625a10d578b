from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
from vllm.v1.sample.ops import topk_topp_sampler as sampler

from serve_app.stages import top_p
from serve_app.stages.top_p import histogram_top_p

VOCAB = 36682  # the tiny Orpheus model's
INF = float("-inf")


def logits(rows: int, scale: float, seed: int) -> torch.Tensor:
    """`rows` rows of random logits, the first 8000 tokens masked as `allowed_token_ids` masks them."""
    x = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale
    x[:, :8000] = INF
    return x


def kept(x: torch.Tensor) -> torch.Tensor:
    return x > INF


@pytest.mark.parametrize(
    "scale",
    [0.17, 3.0],  # a random talker's flat distribution (a nucleus of ~18k tokens), a peaked one (~500)
)
@pytest.mark.parametrize("ps", [[0.8], [0.8, 0.95], [0.5, 0.8, 0.9, 0.99, 0.3, 0.8, 0.7, 0.85]])
def test_it_keeps_the_tokens_vllms_sort_keeps(scale: float, ps: list[float]) -> None:
    x, p = logits(len(ps), scale, seed=len(ps)), torch.tensor(ps)
    expected = sampler.apply_top_k_top_p_pytorch(x.clone(), None, p, allow_cpu_sync=True)
    assert torch.equal(kept(histogram_top_p(x.clone(), p)), kept(expected))
    assert 0 < int(kept(expected).sum()) < len(ps) * (VOCAB - 8000)


def test_kept_logits_are_unchanged_and_a_row_with_p_1_keeps_every_token() -> None:
    x, p = logits(2, 3.0, seed=1), torch.tensor([1.0, 0.8])
    out = histogram_top_p(x.clone(), p)
    assert torch.equal(kept(out[0]), kept(x[0]))
    assert int(kept(out[1]).sum()) < int(kept(x[1]).sum())
    assert torch.equal(out[kept(out)], x[kept(out)])


def test_one_dominant_token_is_kept_alone() -> None:
    x = logits(1, 1.0, seed=2)
    x[0, 9000] = 50.0
    assert kept(histogram_top_p(x, torch.tensor([0.9]))).nonzero()[:, 1].tolist() == [9000]


@pytest.mark.parametrize("bad", [INF, float("nan"), float("inf")])
def test_a_row_that_is_not_finite_keeps_its_tokens_and_leaves_its_neighbours_alone(bad: float) -> None:
    x, p = logits(3, 3.0, seed=4), torch.tensor([0.8, 0.8, 0.8])
    expected = histogram_top_p(x.clone(), p)
    x[0, :] = bad if bad != float("inf") else x[0, :]
    if bad == float("inf"):
        x[0, 9000] = bad
    out = histogram_top_p(x.clone(), p)
    assert torch.equal(kept(out[0]), kept(x[0]))  # nothing masked: as the sort leaves such a row
    assert torch.equal(kept(out[1:]), kept(expected[1:]))


def test_vllm_finds_the_plugin() -> None:
    assert "serve_app.stages.top_p:install" in {e.value for e in entry_points(group="vllm.general_plugins")}


@pytest.fixture
def vllms_function(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, object]]:
    """vLLM's `apply_top_k_top_p` replaced by a recorder (restored after the test), and the plugin's
    environment variable cleared."""
    calls: list[tuple[object, object]] = []

    def original(x: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
        calls.append((k, p))
        return x

    monkeypatch.setattr(sampler, "apply_top_k_top_p", original)
    # Set (not deleted) so that monkeypatch restores it: `top_p.request` writes os.environ itself.
    monkeypatch.setenv(top_p.ENV, "")
    return calls


@pytest.mark.parametrize("asked", [None, "sort"])
def test_unasked_the_plugin_leaves_vllm_alone(vllms_function: list[tuple[object, object]], asked: str | None) -> None:
    if asked is not None:
        top_p.request("sort")
    before = sampler.apply_top_k_top_p
    top_p.install()
    assert sampler.apply_top_k_top_p is before


def test_asked_the_plugin_takes_top_p_alone(vllms_function: list[tuple[object, object]]) -> None:
    top_p.request("histogram")
    top_p.install()
    top_p.install()  # vLLM may load plugins twice in one process: installed once
    x, p, k = logits(1, 3.0, seed=3), torch.tensor([0.8]), torch.tensor([5])
    assert int(kept(sampler.apply_top_k_top_p(x.clone(), None, p)).sum()) < int(kept(x).sum())
    assert vllms_function == []
    sampler.apply_top_k_top_p(x, k, p)
    sampler.apply_top_k_top_p(x, k, None)
    sampler.apply_top_k_top_p(x, None, None)
    sampler.apply_top_k_top_p(x.double(), None, p)  # the histogram reads float32 bits
    assert vllms_function == [(k, p), (k, None), (None, None), (None, p)]
