"""The locust scenarios, run headless by the real `locust` command against the ingress app (FakeLLM)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from tests.unit.bench_support import FakeSpeech, serving, vision_services
from tests.unit.conftest import REPO, FakeLLM


def run_locust(url: str, csv_prefix: Path, *args: str, exit_code: int = 0) -> dict[tuple[str, str], dict[str, str]]:
    """Runs locust for 5 s with 2 users; its statistics rows by (type, name). (2 s made no request at all
    once, in a clean-clone run right after the integration tests: users spawn late on a loaded machine.)"""
    locust = Path(sys.executable).parent / "locust"
    run = subprocess.run(
        [str(locust), "-f", "load/locustfile.py", "--host", url, "--headless", "-u", "2", "-r", "2", "-t", "5s",
         "--only-summary", "--csv", str(csv_prefix), *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == exit_code, run.stderr[-3000:]  # locust exits 1 when any request failed
    with open(f"{csv_prefix}_stats.csv") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def assert_counted(rows: dict[tuple[str, str], dict[str, str]], expected: set[tuple[str, str]]) -> None:
    assert expected <= set(rows)
    for key in expected:
        assert int(rows[key]["Request Count"]) > 0 and rows[key]["Failure Count"] == "0", key


def test_text_and_long_prompt_chat(services: Services, tmp_path: Path) -> None:
    with serving(create_app(services)) as url:
        # Context 128, output 8: 0.3 -> 38-token prompts (served), 2.0 -> 256 tokens (must be refused).
        rows = run_locust(
            url, tmp_path / "run", "--input-len", "16", "--output-len", "8", "--long-fractions", "0.3,2.0",
            "TextChatUser", "LongPromptChatUser",
        )  # fmt: skip
    assert_counted(rows, {
        ("POST", "chat"), ("TTFT", "chat"), ("TPOT", "chat"),
        ("STAGE", "chat: tokenizer"), ("STAGE", "chat: llm_first_chunk"),
        ("POST", "long chat near limit"), ("TTFT", "long chat near limit"), ("POST", "long chat over limit"),
        ("STAGE", "long chat near limit: tokenizer"),
    })  # fmt: skip
    # The chat row is the whole stream: never shorter than its time to first token.
    assert float(rows["POST", "chat"]["Average Response Time"]) >= float(rows["TTFT", "chat"]["Average Response Time"])


def test_image_chat(tiny_vision_model_path: Path, fake_llm: FakeLLM, tmp_path: Path) -> None:
    with serving(create_app(vision_services(tiny_vision_model_path, fake_llm))) as url:
        rows = run_locust(
            url, tmp_path / "run", "--output-len", "4", "--images-per-request", "2", "--image-size", "80x60",
            "--image-format", "png", "ImageChatUser",
        )  # fmt: skip
    assert_counted(rows, {
        ("POST", "image chat"), ("TTFT", "image chat"), ("TPOT", "image chat"),
        ("STAGE", "image chat: multimodal"), ("STAGE", "image chat: tokenizer"),
        ("STAGE", "image chat: llm_first_chunk"),
    })  # fmt: skip
    # What the server got: two images a request (the tiny LLaVA's 56x56), none seen before (no --image-repeat).
    images = [image for request in fake_llm.requests for image in request.images]
    assert images and len(images) == 2 * len(fake_llm.requests)
    assert all(image.pixels.shape == (56, 56, 3) and not image.cache_hit for image in images)
    assert len({image.content_hash for image in images}) == len(images)


def test_speech(tmp_path: Path) -> None:
    fake = FakeSpeech(chunks=4, chunk_s=0.05, gap_s=0.01)
    with serving(fake.app) as url:
        # A threshold no stall of this busy machine reaches: the other test fails streams on purpose.
        rows = run_locust(
            url, tmp_path / "run", "--tts-input-chars", "30", "--voice", "zoe", "--underrun-threshold-ms", "2000",
            "SpeechUser",
        )  # fmt: skip
    assert_counted(rows, {
        ("POST", "speech"), ("TTFA", "speech"), ("UNDERRUN", "speech"),
        ("STAGE", "speech: tokenizer"), ("STAGE", "speech: vocoder_first_chunk"),
    })  # fmt: skip
    e2el, ttfa = (float(rows[kind, "speech"]["Average Response Time"]) for kind in ("POST", "TTFA"))
    assert e2el >= ttfa
    assert {(len(b["input"]), b["voice"], b["response_format"], b["stream"]) for b in fake.bodies} == {
        (30, "zoe", "pcm", True)
    }


def test_speech_underruns_and_rejections_are_failures(tmp_path: Path) -> None:
    # 50 ms of audio every 150 ms: the 4th chunk is 300 ms late, far above the threshold even when a busy
    # machine delays the first chunk (a 90 ms margin once measured 1 stream of 12 below it); one stream at a
    # time, the other user is refused.
    with serving(FakeSpeech(chunks=4, chunk_s=0.05, gap_s=0.15, max_streams=1).app) as url:
        rows = run_locust(url, tmp_path / "run", "--underrun-threshold-ms", "60", "SpeechUser", exit_code=1)
    underruns = rows["UNDERRUN", "speech"]
    assert int(underruns["Failure Count"]) == int(underruns["Request Count"]) > 0
    assert float(underruns["Min Response Time"]) >= 60
    with open(tmp_path / "run_failures.csv") as f:
        failures = {(r["Method"], r["Name"], r["Error"]) for r in csv.DictReader(f)}
    assert failures == {
        ("POST", "speech", "CatchResponseError('rejected: HTTP 503')"),
        ("UNDERRUN", "speech", "Underrun('underrun above 60 ms')"),
    }
