"""deployments/graph.py and configs/*.yaml: the builder validates args; every shipped config is valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments.graph import build_app, check_transport_fits
from deployments.health import build_health_app
from load.graph_launcher import ray_env
from load.serve_config import GRAPH_IMPORT_PATH, HEALTH_IMPORT_PATH, graph_apps
from serve_app.config import parse_app_args
from serve_app.graph_health import GraphHealthArgs
from serve_app.strict_args import ConfigError, parse_args
from tests.unit.config_support import assert_deployments_are_the_builders

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    return config


def test_there_are_cpu_defaults_and_gpu_examples() -> None:
    assert {p.name for p in CONFIGS} >= {"cpu-tiny.yaml", "gpu-llama.yaml", "gpu-llava.yaml", "gpu-orpheus.yaml"}
    (app,) = graph_apps(load(CONFIGS[0].parent / "cpu-tiny.yaml"))  # one base URL for every model
    assert app["route_prefix"] == "/"
    models = {m["model"]["served_model_name"]: m for m in app["args"]["models"]}
    assert list(models) == ["tiny-chat", "tiny-llava", "tiny-orpheus"]
    assert "multimodal" not in models["tiny-chat"] and "tts" not in models["tiny-chat"]
    assert "multimodal" in models["tiny-llava"]
    assert "tts" in models["tiny-orpheus"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_a_valid_serve_config_with_valid_args(path: Path) -> None:
    schema = ServeDeploySchema.model_validate(load(path))
    for app, raw in zip(schema.applications, load(path)["applications"], strict=True):
        if app.import_path == HEALTH_IMPORT_PATH:
            continue  # test_the_health_app_watches_every_graph_app
        assert app.import_path == GRAPH_IMPORT_PATH
        assert_deployments_are_the_builders(raw)
        for deployment in raw["deployments"]:
            assert "max_ongoing_requests" in deployment
            assert "max_queued_requests" in deployment
            assert "num_replicas" in deployment or "autoscaling_config" in deployment


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_health_app_watches_every_graph_app(path: Path) -> None:
    config = load(path)
    (health,) = [a for a in config["applications"] if a["import_path"] == HEALTH_IMPORT_PATH]
    assert health["route_prefix"] == "/health"
    args = parse_args(GraphHealthArgs, health["args"])
    assert sorted(args.applications) == sorted(a["name"] for a in graph_apps(config))
    (deployment,) = health["deployments"]
    assert deployment["name"] == "health"
    assert {"num_replicas", "max_ongoing_requests", "max_queued_requests"} <= deployment.keys()


@pytest.mark.parametrize("apps", [[], ["llm-app", "llm-app"]])
def test_the_health_app_names_a_bad_field(apps: list[str]) -> None:
    with pytest.raises(ConfigError, match="applications"):
        build_health_app({"applications": apps})


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_stage_holding_a_stream_waits_as_long_for_it_to_end(path: Path) -> None:
    """Ingress, llm and vocoder hold the same open stream: a shorter grace on any cuts it at shutdown."""
    for raw in graph_apps(load(path)):
        streaming = [d for d in raw["deployments"] if d["name"].rsplit("-", 1)[-1] in {"ingress", "llm", "vocoder"}]
        graces = {d["name"]: d.get("graceful_shutdown_timeout_s") for d in streaming}
        assert len(set(graces.values())) == 1, f"{raw['name']}: {graces}"
        assert min(v or 0 for v in graces.values()) >= 60, f"{raw['name']}: {graces}"


def bound_stages(app: Any) -> list[str]:
    ingress = app._bound_deployment
    assert ingress.name == "ingress"
    stages: dict[str, dict[str, Any]] = ingress.init_args[1]
    return sorted(stage._bound_deployment.name for model in stages.values() for stage in model.values())


def test_builder_binds_three_deployments_for_text(tiny_model_path: Path) -> None:
    app = build_app({"model": {"path": str(tiny_model_path), "max_model_len": 256}})
    assert bound_stages(app) == ["llm", "tokenizer"]


def test_builder_binds_the_multimodal_stage_for_images(tiny_model_path: Path) -> None:
    app = build_app({"model": {"path": str(tiny_model_path), "max_model_len": 256}, "multimodal": {}})
    assert bound_stages(app) == ["llm", "multimodal", "tokenizer"]


def test_builder_binds_the_vocoder_for_speech(tiny_model_path: Path) -> None:
    tts = {"codec": "snac", "voices": ["tara"]}
    app = build_app({"model": {"path": str(tiny_model_path), "max_model_len": 256}, "tts": tts})
    assert bound_stages(app) == ["llm", "tokenizer", "vocoder"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"model": {"path": "m", "max_model_len": 4}}, "model.max_model_len"),
        ({"model": {"path": "m", "max_model_len": 512}, "engine": {"dtype": "int3"}}, "engine.dtype"),
        ({"model": {"path": "m", "max_model_len": 512}, "tokenizer": {"threads": 0}}, "tokenizer.threads"),
        ({"model": {"max_model_len": 512}}, "model.path"),
        ({"model": {"path": "m", "max_model_len": 512}, "typo": 1}, "typo"),
        ({"model": {"path": "m", "max_model_len": 512}, "multimodal": {"formats": ["SVG"]}}, "multimodal.formats"),
        ({"model": {"path": "m", "max_model_len": 512}, "engine": {"model_impl": "x"}}, "engine.model_impl"),
        ({"model": {"path": "m", "max_model_len": 512}, "tts": {"codec": "c", "voices": []}}, "tts.voices"),
    ],
)
def test_builder_fails_fast_naming_the_field(args: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_app(args)


@pytest.mark.parametrize("grpc", [True, False])
def test_a_body_limit_over_the_grpc_message_limit_is_a_config_error(raw_args: dict[str, Any], grpc: bool) -> None:
    args = parse_app_args(raw_args | {"limits": {"max_request_bytes": 2**23}})
    if grpc:
        with pytest.raises(ConfigError, match=r"limits.max_request_bytes \(8388608\) exceeds RAY_SERVE_REPLICA_GRPC"):
            check_transport_fits(args, grpc=True, max_message_bytes=2**22)
    else:  # Serve's default transport (Ray's object store) has no such limit
        check_transport_fits(args, grpc=False, max_message_bytes=2**22)
    check_transport_fits(args, grpc=True, max_message_bytes=2**23)


def test_the_clusters_environment_leaves_room_for_the_default_body_limit(raw_args: dict[str, Any]) -> None:
    args = parse_app_args({"model": raw_args["model"]})
    check_transport_fits(args, grpc=True, max_message_bytes=int(ray_env()["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"]))


def test_builder_names_each_models_stages_after_it(tiny_model_path: Path) -> None:
    model = {"path": str(tiny_model_path), "max_model_len": 256}
    app = build_app({"models": [
        {"model": model | {"served_model_name": "text"}},
        {"model": model | {"served_model_name": "eyes"}, "multimodal": {}},
        {"model": model | {"served_model_name": "voice"}, "tts": {"codec": "snac", "voices": ["tara"]}},
    ]})  # fmt: skip
    assert bound_stages(app) == [
        "eyes-llm", "eyes-multimodal", "eyes-tokenizer", "text-llm", "text-tokenizer",
        "voice-llm", "voice-tokenizer", "voice-vocoder",
    ]  # fmt: skip
    graph = app._bound_deployment.init_args[0]
    assert [args.model.name for args in graph.models] == ["text", "eyes", "voice"]


@pytest.mark.parametrize(
    ("models", "field"),
    [
        ([{"model": {"path": "a", "max_model_len": 512}}, {"model": {"path": "x/a", "max_model_len": 512}}],
         r"models.1.model.served_model_name: `a` is served twice"),
        ([{"model": {"path": "m", "served_model_name": "a#b", "max_model_len": 512}}],
         r"models.0.model.served_model_name: `a#b` must not contain '#'"),
        ([{"model": {"path": "m", "max_model_len": 512}, "auth": {"api_keys": ["k"]}}], r"models.0.auth"),
        ([{"model": {"path": "m", "max_model_len": 4}}], r"models.0.model.max_model_len"),
        ([], "models"),
    ],
)  # fmt: skip
def test_builder_fails_fast_naming_the_models_field(models: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_app({"models": models})
