"""`to_sampling_params` in serve_app/stages/llm.py: the request's sampling spec as vLLM's real
`SamplingParams`, and the values vLLM rejects as the client's 400."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.sampling_params import RequestOutputKind

from serve_app.errors import BadRequestError
from serve_app.messages import SamplingSpec
from serve_app.stages.llm import sampling_defaults, to_sampling_params


def test_to_sampling_params_maps_every_field() -> None:
    spec = SamplingSpec(
        max_tokens=17,
        n=3,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=1234,
        stop=["\n\n", "END"],
        stop_token_ids=[2, 5],
        ignore_eos=True,
        min_tokens=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        logprobs=3,
        prompt_logprobs=2,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    p = to_sampling_params(spec)
    assert (p.max_tokens, p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (
        17,
        3,
        0.7,
        0.9,
        40,
        0.05,
        1234,
    )
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.min_tokens) == (["\n\n", "END"], [2, 5], True, 2)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.1)
    assert (p.logprobs, p.include_stop_str_in_output, p.skip_special_tokens) == (3, True, False)
    assert p.prompt_logprobs == 2
    assert p.output_kind == RequestOutputKind.DELTA


def test_to_sampling_params_leaves_unset_fields_to_vllm() -> None:
    p = to_sampling_params(SamplingSpec(max_tokens=4))
    assert (p.temperature, p.top_p, p.min_p, p.presence_penalty, p.repetition_penalty) == (
        1.0,
        1.0,
        0.0,
        0.0,
        1.0,
    )
    assert (p.n, p.seed, p.logprobs, p.stop, p.skip_special_tokens) == (1, None, None, [], True)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"n": 0}, "n must be at least 1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"temperature": -1.0}, "temperature must be non-negative"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"min_p": 2.0}, "min_p must be in [0, 1]"),
        ({"presence_penalty": 3.0}, "presence_penalty must be in [-2, 2]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero"),
        ({"top_k": -2}, "top_k must be 0 (disable), or at least 1"),
        ({"n": 2, "temperature": 0.0}, "n must be 1 when using greedy sampling"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens must be less than or equal to max_tokens"),
    ],
)
def test_values_vllm_rejects_are_400(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(BadRequestError) as info:
        to_sampling_params(SamplingSpec(**{"max_tokens": 8, **fields}))
    assert info.value.status_code == 400
    assert words in info.value.message


def test_defaults_fill_what_the_request_leaves_out() -> None:
    defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}
    p = to_sampling_params(SamplingSpec(max_tokens=4, temperature=0.3, top_k=5), defaults=defaults)
    assert (p.temperature, p.top_k) == (0.3, 5)  # the request's own values win
    assert (p.top_p, p.repetition_penalty, p.min_p) == (0.9, 1.05, 0.0)


@pytest.mark.parametrize(("source", "expected"), [("auto", {"temperature": 0.6, "top_p": 0.9}), ("vllm", {})])
def test_sampling_defaults_come_from_the_models_generation_config(
    tiny_model_path: Path, tmp_path: Path, source: str, expected: dict[str, Any]
) -> None:
    from vllm.config import ModelConfig

    model = tmp_path / "model"
    shutil.copytree(tiny_model_path, model)
    config = json.loads((model / "generation_config.json").read_text())
    config.update(temperature=0.6, top_p=0.9, max_new_tokens=50)  # as Llama 3.1 Instruct's, plus a budget
    (model / "generation_config.json").write_text(json.dumps(config))
    engine = SimpleNamespace(model_config=ModelConfig(model=str(model), generation_config=source))
    assert sampling_defaults(engine) == expected  # its max_new_tokens is not a default budget here
