"""Constants and helpers shared by the integration tests and their fixtures."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from load.serve_config import pin_local_paths

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu-tiny.yaml"
PORT = int(os.environ.get("SERVE_GRAPH_TEST_PORT", "18123"))
APP = "llm-app"
VISION_APP = "vision-app"
VISION_PREFIX = "/vision"
TTS_PREFIX = "/tts"
# A second loopback address, allow-listed for image fetching in the test config only: 127.0.0.1 stays
# refused as in the shipped config, so one graph shows both the default and the configured behaviour.
ALLOWED_LOOPBACK = "127.0.0.2"


def load_test_config() -> dict[str, Any]:
    """The default config, on a test port and with the model paths pinned to this checkout."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    config["http_options"]["port"] = PORT
    for app in pin_local_paths(config, ROOT)["applications"]:
        if "multimodal" in app["args"]:
            app["args"]["multimodal"]["fetch"] = {"allowed_hosts": [ALLOWED_LOOPBACK], "timeout_s": 5}
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
