"""The locust scenarios, run headless by the real `locust` command against the ingress app (FakeLLM)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline import Services
from tests.unit.bench_support import serving
from tests.unit.conftest import REPO


def test_text_and_long_prompt_chat(services: Services, tmp_path: Path) -> None:
    locust = Path(sys.executable).parent / "locust"
    with serving(create_app(services)) as url:
        # Context 128, output 8: 0.3 -> 38-token prompts (served), 2.0 -> 256 tokens (must be refused).
        run = subprocess.run(
            [str(locust), "-f", "load/locustfile.py", "--host", url, "--headless", "-u", "2", "-r", "2", "-t", "2s",
             "--only-summary", "--csv", str(tmp_path / "run"), "--input-len", "16", "--output-len", "8",
             "--long-fractions", "0.3,2.0", "TextChatUser", "LongPromptChatUser"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]  # locust exits 1 when any request failed
    with open(tmp_path / "run_stats.csv") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    expected = {
        ("POST", "chat"), ("TTFT", "chat"), ("TPOT", "chat"),
        ("STAGE", "chat: tokenizer"), ("STAGE", "chat: llm_first_chunk"),
        ("POST", "long chat near limit"), ("TTFT", "long chat near limit"), ("POST", "long chat over limit"),
        ("STAGE", "long chat near limit: tokenizer"),
    }  # fmt: skip
    assert expected <= set(rows)
    for key in expected:
        assert int(rows[key]["Request Count"]) > 0 and rows[key]["Failure Count"] == "0", key
    # The chat row is the whole stream: never shorter than its time to first token.
    assert float(rows["POST", "chat"]["Average Response Time"]) >= float(rows["TTFT", "chat"]["Average Response Time"])
