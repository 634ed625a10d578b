"""The engine ceiling's pure parts: options, prompts, the driver's in-flight cap and the result document.
Nothing here starts vLLM: the driver runs on a fake stage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from load import ceiling
from load.offline import word_dataset, write_result
from serve_app.messages import ChoiceDelta, GenerateRequest, GenerationChunk, SamplingSpec
from tests.unit.conftest import MODEL_NAME


class SlowStage:
    """One token per step, yielding to the loop between steps, counting requests in flight."""

    def __init__(self) -> None:
        self.in_flight = self.most_in_flight = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for _ in range(request.sampling.max_tokens):
            await asyncio.sleep(0)
            yield GenerationChunk([ChoiceDelta(0, "a", [7], None, None, None)], False)
        self.in_flight -= 1


def test_defaults_match_the_text_bench_scenario() -> None:
    opts = ceiling.parse_args([])
    assert (opts.config, opts.app, opts.requests, opts.input_len, opts.output_len) == (
        "configs/cpu-tiny.yaml", "tiny-chat", 256, 256, 32,
    )  # fmt: skip
    assert opts.concurrency is None
    with pytest.raises(SystemExit):
        ceiling.parse_args(["--requests", "0"])


def test_prompts_are_input_len_tokens(hf_tokenizer: Any) -> None:
    dataset = word_dataset(hf_tokenizer, MODEL_NAME, input_len=40, output_len=8, seed=1)
    for i in range(4):
        assert len(hf_tokenizer.encode(dataset.prompt(i).text, add_special_tokens=False)) == 40
    assert dataset.prompt(0) != dataset.prompt(1)


async def test_drive_caps_requests_in_flight() -> None:
    stage = SlowStage()
    spec = SamplingSpec(max_tokens=5, temperature=0.0, ignore_eos=True)
    generated = await ceiling.drive(stage, [[1, 2, 3]] * 10, spec, concurrency=3)  # type: ignore[arg-type]
    assert generated == [5] * 10
    assert stage.most_in_flight == 3


def test_result_document() -> None:
    opts = ceiling.parse_args(["--requests", "64", "--label", "quiet machine"])
    result = ceiling.build_result(opts, MODEL_NAME, prompt_tokens=256, duration_s=2.0, output_tokens=64 * 32)
    assert result["kind"] == "ceiling"
    assert (result["requests"], result["concurrency"], result["label"]) == (64, 64, "quiet machine")
    assert (result["request_throughput"], result["output_throughput"]) == (32.0, 1024.0)
    json.dumps(result, allow_nan=False)


def test_result_file_has_run_meta(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    write_result({"kind": "ceiling"}, "load.ceiling", ["--requests", "64"], str(out))
    saved = json.loads(out.read_text())
    assert (saved["kind"], saved["command"]) == ("ceiling", "python -m load.ceiling --requests 64")
    assert {"date", "machine"} <= saved.keys()
