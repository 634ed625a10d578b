"""Constants and helpers shared by the integration tests and their fixtures."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu-tiny.yaml"
PORT = int(os.environ.get("SERVE_GRAPH_TEST_PORT", "18123"))
APP = "llm-app"


def load_test_config() -> dict[str, Any]:
    """The default config, on a test port and with the model path pinned to this checkout."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    config["http_options"]["port"] = PORT
    app = config["applications"][0]
    app["args"]["model"]["path"] = str(ROOT / "models" / "tiny-chat")
    return config


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def graph_healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
