"""The locust scenarios, run headless by the real `locust` command against the ingress app (FakeLLM)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline import Services
from tests.unit.bench_support import serving, vision_services
from tests.unit.conftest import REPO, FakeLLM


def run_locust(url: str, csv_prefix: Path, *args: str) -> dict[tuple[str, str], dict[str, str]]:
    """Runs locust for 2 s with 2 users; its statistics rows by (type, name)."""
    locust = Path(sys.executable).parent / "locust"
    run = subprocess.run(
        [str(locust), "-f", "load/locustfile.py", "--host", url, "--headless", "-u", "2", "-r", "2", "-t", "2s",
         "--only-summary", "--csv", str(csv_prefix), *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]  # locust exits 1 when any request failed
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
