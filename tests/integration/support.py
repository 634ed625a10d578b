"""Constants and helpers shared by the integration tests and their fixtures."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import psutil
import yaml

from load.serve_config import pin_local_paths
from serve_app.graph_args import deployment_name

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu-tiny.yaml"
PORT = int(os.environ.get("SERVE_GRAPH_TEST_PORT", "18123"))
# The application serving every model at `/` (configs/cpu-tiny.yaml), and its models.
APP = "openai"
TEXT_MODEL, VISION_MODEL, TTS_MODEL = "tiny-chat", "tiny-llava", "tiny-orpheus"
# The graph's `/health` application (configs/cpu-tiny.yaml).
HEALTH_APP = "health-app"
# The vision model's engine hang watchdog, small so that test_zy_faults.py sees it fire within seconds.
WATCHDOG_TIMEOUT_S = 8.0
# A second application in the test config only: tiny-chat with tiny limits, so that one request fills the
# engine (backpressure, disconnect and deadline tests) and its tokenizer autoscales within seconds.
LIMITS_APP = "limits-app"
LIMITS_PREFIX = "/limits"
# The limits-app's context: the tiny model's whole 32768 positions, so that a generation a test holds open
# is still running when the test is done with it on any engine (30,000 tokens: a minute at the fastest
# single-sequence decode measured here, ~500 tokens/s), unless aborted.
LIMITS_MAX_MODEL_LEN = 32768
LONG: dict[str, Any] = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 30000, "ignore_eos": True}
# The session's Ray cluster simulates three node types on this machine, each advertising one custom
# resource, and the test config pins every stage to one of them as a real cluster's YAML would (the
# engines would ask for `num_gpus` there; a GPU cannot be simulated here).
NODES: dict[str, dict[str, Any]] = {
    "head_node": {"num_cpus": 1},
    "cpu_node": {"num_cpus": 1},
    "accelerator_node": {"num_cpus": 2},
}
STAGE_NODE = {"ingress": "head_node", "tokenizer": "cpu_node", "multimodal": "cpu_node", "vocoder": "cpu_node",
              "llm": "accelerator_node", "health": "head_node"}  # fmt: skip
# A second loopback address, allow-listed for image fetching in the test config only: 127.0.0.1 stays
# refused as in the shipped config, so one graph shows both the default and the configured behaviour.
ALLOWED_LOOPBACK = "127.0.0.2"


def deployment(model: str, stage: str) -> str:
    """The Serve deployment of a model's stage (deployments/graph.py names them so)."""
    return deployment_name(model, stage)


def health_key(name: str) -> str:
    """The key of deployment `name` in a several-model ingress's health report: `tiny-chat-llm` -> `tiny-chat/llm`."""
    model, stage = name.rsplit("-", 1)
    return f"{model}/{stage}"


def load_test_config() -> dict[str, Any]:
    """The default config, on a test port and with the model paths pinned to this checkout."""
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    config["http_options"]["port"] = PORT
    for app in pin_local_paths(config, ROOT)["applications"]:
        for model in app["args"].get("models", []):
            if "multimodal" in model:
                model["multimodal"]["fetch"] = {"allowed_hosts": [ALLOWED_LOOPBACK], "timeout_s": 5}
                model["engine"]["watchdog_timeout_s"] = WATCHDOG_TIMEOUT_S
    config["applications"].append(limits_app(config["applications"][0]))
    next(a for a in config["applications"] if a["name"] == HEALTH_APP)["args"]["applications"].append(LIMITS_APP)
    for app in config["applications"]:
        for each in app["deployments"]:
            options = each.setdefault("ray_actor_options", {})
            options["resources"] = {STAGE_NODE[each["name"].rsplit("-", 1)[-1]]: 0.01}
    return config


def model_args(config: dict[str, Any], model: str) -> dict[str, Any]:
    """The args of `model` in the config's graph application."""
    app = next(a for a in config["applications"] if a["name"] == APP)
    return next(m for m in app["args"]["models"] if m["model"]["served_model_name"] == model)


def limits_app(graph_app: dict[str, Any]) -> dict[str, Any]:
    """The text model alone, with room for two sequences in the engine and one waiting request."""
    app = copy.deepcopy(graph_app)
    app["name"], app["route_prefix"] = LIMITS_APP, LIMITS_PREFIX
    text = next(m for m in app["args"]["models"] if m["model"]["served_model_name"] == TEXT_MODEL)
    app["args"]["models"] = [text]
    text["model"]["max_model_len"] = LIMITS_MAX_MODEL_LEN
    text["engine"]["max_num_seqs"] = 2
    # No engine waiting queue: a third sequence is refused by the llm stage (engine_queue_full).
    text["engine"]["max_waiting_requests"] = 0
    # Admitted by count, so that the engine's and Serve's own bounds are what these tests meet.
    text["admission"] = {"max_in_flight": 64}
    text["tokenizer"]["threads"] = 1
    ours = {"ingress", deployment(TEXT_MODEL, "tokenizer"), deployment(TEXT_MODEL, "llm")}
    app["deployments"] = [d for d in app["deployments"] if d["name"] in ours]
    deployments = {d["name"]: d for d in app["deployments"]}
    deployments[deployment(TEXT_MODEL, "llm")].update(max_ongoing_requests=2, max_queued_requests=1)
    tokenizer = deployments[deployment(TEXT_MODEL, "tokenizer")]
    del tokenizer["num_replicas"]
    # Short delays and a fast metrics loop, so that a test sees a scale-up and a scale-down in seconds.
    tokenizer["autoscaling_config"] = {
        "min_replicas": 1, "max_replicas": 2, "initial_replicas": 1, "target_ongoing_requests": 2,
        "metrics_interval_s": 0.5, "look_back_period_s": 2, "upscale_delay_s": 1, "downscale_delay_s": 4,
    }  # fmt: skip
    return app


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


# How often the graph's /health application asks each ingress (its `poll_interval_s` default): the graph's
# /health reports what a request saw, or a stage's death, at most this much later than the app's own.
GRAPH_HEALTH_POLL_S = 1.0


def stage_health(base_url: str, app: str) -> dict[str, str]:
    """{stage: "ok" or what failed} of `app`: from its own `<prefix>/health`, or for the application at
    `/`, whose `/health` is the graph's, from the graph's report of it (`?verbose`: a green `/health`
    is HAProxy's answer, which names no stage)."""
    body = httpx.get(f"{base_url}/health?verbose", timeout=5).json()
    stages: dict[str, str] = body["stages"] if "stages" in body else body["applications"][app]["stages"]
    return stages


def error_fields(error: openai.APIError) -> dict[str, Any]:
    """The fields of an `openai` error's JSON error object (`code`, `param`...): the client types it `object`."""
    return cast(dict[str, Any], error.body)


def health_status(base_url: str) -> int:
    """`/health`'s status code, 0 if it did not answer."""
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def graph_healthy(base_url: str) -> bool:
    return health_status(base_url) == 200


def engine_core_pid(replica_pid: int) -> int:
    """The one vLLM engine core under an llm replica."""
    cores = [p for p in psutil.Process(replica_pid).children(recursive=True) if "EngineCore" in p.name()
             or "EngineCore" in " ".join(p.cmdline())]  # fmt: skip
    assert len(cores) == 1, cores
    return int(cores[0].pid)
