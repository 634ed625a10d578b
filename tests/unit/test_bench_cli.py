"""`load.bench.main` end to end against the ingress app (real tokenizer, FakeLLM) on a real port."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from load.bench import main
from load.bench.cli import parse_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.bench_support import SPEECH_MODEL, FakeSpeech, serving, vision_services
from tests.unit.conftest import FakeLLM


@pytest.fixture
def url(services: Services) -> Iterator[str]:
    with serving(create_app(services)) as base_url:
        yield base_url


def test_two_targets_interleaved(url: str, tmp_path: Path) -> None:
    results = main([
        "--target", f"a={url}", "--target", f"b={url}/", "--concurrency", "1", "2", "--duration", "0.3",
        "--rounds", "2", "--input-len", "16", "--output-len", "4", "--goodput", "ttft:10000", "tpot:10000",
        "--health-interval", "0.05", "--rest", "0.2", "--out", str(tmp_path), "--no-progress",
    ])  # fmt: skip
    assert [c["target"] for c in results["cells"]] == ["a", "b", "b", "a", "b", "a", "a", "b"]
    for target in ("a", "b"):
        for level in ("1", "2"):
            m = results["results"][target][level]
            assert m["completed"] > 0 and m["failed"] == 0
            assert m["total_output_tokens"] == 4 * m["completed"]
            assert m["total_input_tokens"] == 16 * m["completed"]
            assert m["request_goodput"] == m["request_throughput"]
            assert m["health_ms"]["n"] > 0 and m["health_ms"]["failures"] == 0
            stamped = m["health_stamped_ms"]  # the same probes, by the kernel's stamps
            assert stamped["n"] > 0 and stamped["n"] + stamped["unstamped"] == m["health_ms"]["n"]
            # The server listens in this process: read at rest first, then above it per request.
            assert isinstance(m["cpu"]["rest_outside_engine_core_share"], float)
            assert isinstance(m["cpu"]["above_rest_ms_per_request"], float)
    assert {p.name for p in tmp_path.iterdir()} == {
        "results.json", "results.md", "latency_vs_level.png", "health_over_time.png",
    }  # fmt: skip
    assert json.loads((tmp_path / "results.json").read_text())["levels"] == ["1", "2"]
    assert "| a | 2 |" in (tmp_path / "results.md").read_text()


def test_long_prompts_at_a_request_rate(url: str, tmp_path: Path) -> None:
    # Context 128, output 8: 0.3 -> 38 tokens (served), 2.0 -> 256 tokens (refused with 400).
    results = main([
        "--target", f"graph={url}", "--endpoint", "chat", "--dataset", "long", "--long-fractions", "0.3", "2.0",
        "--output-len", "8", "--request-rate", "40", "--max-concurrency", "4", "--duration", "0.5",
        "--warmup", "0", "--rest", "0", "--out", str(tmp_path), "--no-plots", "--no-progress",
    ])  # fmt: skip
    assert results["config"]["input_lens"] == [38, 256]
    m = results["results"]["graph"]["40"]
    assert m["completed"] > 0 and m["errors"] == {"HTTP 400": m["failed"]}
    assert abs(m["completed"] - m["failed"]) <= 1  # the two lengths alternate
    assert m["request_goodput"] is None
    assert (
        "Failures (--dataset long: prompts beyond the context are refused by design): graph @ 40: {'HTTP 400':"
        in (tmp_path / "results.md").read_text()
    )


def test_image_chat(tiny_vision_model_path: Path, fake_llm: FakeLLM, tmp_path: Path) -> None:
    with serving(create_app(vision_services(tiny_vision_model_path, fake_llm))) as url:
        results = main([
            "--target", f"vision={url}", "--dataset", "image", "--images-per-request", "2", "--image-size", "80x60",
            "--image-repeat", "0.5", "--output-len", "4", "--concurrency", "2", "--duration", "0.5",
            "--rest", "0", "--out", str(tmp_path), "--no-plots", "--no-progress",
        ])  # fmt: skip
    assert (results["config"]["endpoint"], results["config"]["input_lens"]) == ("chat", [32])
    m = results["results"]["vision"]["2"]
    assert m["completed"] > 0 and m["failed"] == 0
    assert m["total_input_tokens"] > m["completed"] * (32 + 2 * 16)  # the text, two images, the template
    assert set(m["stage_ms"]) == {"multimodal", "tokenizer", "llm_first_chunk", "first_token"}
    assert all(len(request.images) == 2 for request in fake_llm.requests)
    hits = [image.cache_hit for request in fake_llm.requests for image in request.images]
    assert any(hits) and not all(hits)  # the repeated half hits the stage's cache after the first few
    assert "| vision | 2 | " in (tmp_path / "results.md").read_text()
    assert "multimodal | tokenizer | llm_first_chunk | first_token" in (tmp_path / "results.md").read_text()


def test_speech(tmp_path: Path) -> None:
    fake = FakeSpeech(chunks=4, chunk_s=0.05, gap_s=0.01)
    with serving(fake.app) as url:
        results = main([
            "--target", f"tts={url}", "--dataset", "tts", "--tts-input-chars", "40", "--voice", "leah",
            "--concurrency", "2", "--duration", "0.3", "--warmup", "1", "--rest", "0", "--out", str(tmp_path),
            "--no-progress",
        ])  # fmt: skip
    assert (results["endpoint"], results["config"]["input_lens"]) == ("speech", [40])
    m = results["results"]["tts"]["2"]
    assert m["completed"] >= 30 and m["failed"] == m["rejected"] == 0  # --min-streams' default, past --duration
    # The server listens in this very process: its CPU is read (client and server together here).
    assert results["targets"]["tts"]["cpu_scope"] == f"descendants of {os.getpid()}"
    assert m["cpu"]["outside_engine_ms_per_request"] > 0
    # This process (python or python3); in a `make test` run the integration tests' Ray cluster, a child of
    # this process too, is counted beside it.
    assert any(role.startswith("other:python") for role in m["cpu"]["roles"])
    assert m["total_audio_s"] == pytest.approx(0.2 * m["completed"])
    # Client and server share this process's GIL: no claim on how late the audio comes, only that it is measured.
    assert 0 <= m["underrun_rate"] <= 1 and m["rtf"]["p50"] > 0 and m["ttfa_ms"]["p50"] > 0
    assert set(m["stage_ms"]) == {"tokenizer", "llm_first_chunk", "vocoder_first_chunk"}
    sent = {(len(b["input"]), b["voice"], b["model"], b["response_format"], b["stream"]) for b in fake.bodies}
    assert sent == {(40, "leah", SPEECH_MODEL, "pcm", True)}
    assert len({b["input"] for b in fake.bodies}) == len(fake.bodies)  # a new text every request
    assert {p.name for p in tmp_path.iterdir()} == {
        "results.json", "results.md", "latency_vs_level.png", "health_over_time.png",
    }  # fmt: skip
    assert "| tts | 2 | " in (tmp_path / "results.md").read_text()
    assert "Too few streams" not in (tmp_path / "results.md").read_text()


def test_speech_rejections_are_not_failures(tmp_path: Path) -> None:
    with serving(FakeSpeech(max_streams=1).app) as url:
        results = main([
            "--target", f"tts={url}", "--dataset", "tts", "--concurrency", "3", "--duration", "0.3",
            "--underrun-threshold-ms", "0", "--rest", "0", "--out", str(tmp_path), "--no-plots", "--no-progress",
        ])  # fmt: skip
    m = results["results"]["tts"]["3"]
    assert m["completed"] > 0 and m["rejected"] > 0 and m["failed"] == 0 and m["errors"] == {}
    assert m["underrun_threshold_ms"] == 0.0
    assert "Rejections (HTTP 503): tts @ 3: " in (tmp_path / "results.md").read_text()


def test_vllm_cannot_serve_speech(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--start", "vllm:configs/cpu-tiny.yaml@tiny-orpheus", "--dataset", "tts"])
    assert "`vllm serve` has no /v1/audio/speech" in capsys.readouterr().err


def test_defaults_depend_on_the_dataset() -> None:
    text = parse_args(["--target", "a=http://x"])
    assert (text.endpoint, text.input_len) == ("completions", 256)
    image = parse_args(["--target", "a=http://x", "--dataset", "image"])
    assert (image.endpoint, image.input_len) == ("chat", 32)
    assert (image.images_per_request, image.image_size, image.image_format, image.image_repeat) == (
        1, "1024x768", "jpeg", 0.0,
    )  # fmt: skip
    speech = parse_args(["--start", "baseline:@tiny-orpheus", "--dataset", "tts"])
    assert (speech.endpoint, speech.input_len, speech.tts_input_chars, speech.voice) == ("speech", None, 120, "tara")
    assert speech.underrun_threshold_ms == 100.0
    assert (speech.min_streams, speech.max_duration) == (30, 300.0)
    assert parse_args(["--target", "a=http://x", "--duration", "400"]).max_duration == 400.0
    handicapped = parse_args(["--target", "graph=http://x", "--start", "vllm", "--handicap", "vllm=nice 19"])
    assert handicapped.handicapped == {"vllm": "nice 19"}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--target", "a=http://x", "--max-concurrency", "4"],
        ["--target", "a=http://x", "--concurrency", "0"],
        ["--target", "a=http://x", "--goodput", "ttft"],
        ["--target", "a=http://x", "--concurrency", "2", "--request-rate", "1"],
        ["--target", "http://x"],
        ["--target", "a=x:8000"],
        ["--target", "a=http://x", "--target", "a=http://y"],
        ["--target", "baseline=http://x", "--start", "baseline"],
        ["--target", "a=http://x", "--dataset", "image", "--endpoint", "completions"],
        ["--target", "a=http://x", "--dataset", "image", "--image-size", "640"],
        ["--target", "a=http://x", "--dataset", "image", "--image-size", "0x480"],
        ["--target", "a=http://x", "--dataset", "image", "--image-repeat", "1.5"],
        ["--target", "a=http://x", "--dataset", "image", "--images-per-request", "0"],
        ["--target", "a=http://x", "--dataset", "image", "--image-format", "gif"],
        ["--target", "a=http://x", "--dataset", "tts", "--endpoint", "chat"],
        ["--target", "a=http://x", "--dataset", "tts", "--input-len", "16"],
        ["--target", "a=http://x", "--dataset", "tts", "--goodput", "ttft:500"],
        ["--target", "a=http://x", "--dataset", "tts", "--tts-input-chars", "0"],
        ["--target", "a=http://x", "--dataset", "tts", "--underrun-threshold-ms", "-1"],
        ["--target", "a=http://x", "--input-len", "0"],
        ["--target", "a=http://x", "--handicap", "a"],
        ["--target", "a=http://x", "--handicap", "b=nice 19"],
        ["--target", "a=http://x", "--min-streams", "-1"],
        ["--target", "a=http://x", "--duration", "60", "--max-duration", "30"],
    ],
)
def test_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
