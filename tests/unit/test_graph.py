"""deployments/graph.py and configs/*.yaml: the builder validates args; every shipped config is valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments.graph import build_app
from serve_app.config import ConfigError, parse_app_args

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    return config


def test_there_is_a_cpu_default_and_a_gpu_example() -> None:
    assert {p.name for p in CONFIGS} >= {"cpu-tiny.yaml", "gpu-llama.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_a_valid_serve_config_with_valid_args(path: Path) -> None:
    schema = ServeDeploySchema.model_validate(load(path))
    (app,) = schema.applications
    assert app.import_path == "deployments.graph:build_app"
    parse_app_args(app.args)
    names = {d["name"] for d in load(path)["applications"][0]["deployments"]}
    assert names == {"ingress", "tokenizer", "llm"}
    for deployment in load(path)["applications"][0]["deployments"]:
        assert "max_ongoing_requests" in deployment
        assert "max_queued_requests" in deployment
        assert "num_replicas" in deployment or "autoscaling_config" in deployment


def test_builder_binds_three_deployments(tiny_model_path: Path) -> None:
    app = build_app({"model": {"path": str(tiny_model_path), "max_model_len": 256}})
    ingress = app._bound_deployment
    assert ingress.name == "ingress"
    assert sorted(arg._bound_deployment.name for arg in ingress.init_args[1:]) == ["llm", "tokenizer"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"model": {"path": "m", "max_model_len": 4}}, "model.max_model_len"),
        ({"model": {"path": "m", "max_model_len": 512}, "engine": {"dtype": "int3"}}, "engine.dtype"),
        ({"model": {"path": "m", "max_model_len": 512}, "tokenizer": {"threads": 0}}, "tokenizer.threads"),
        ({"model": {"max_model_len": 512}}, "model.path"),
        ({"model": {"path": "m", "max_model_len": 512}, "typo": 1}, "typo"),
    ],
)
def test_builder_fails_fast_naming_the_field(args: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_app(args)
