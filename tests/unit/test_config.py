"""serve_app/config.py: parsing and validating the application args."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from serve_app.config import AppArgs, parse_app_args
from serve_app.strict_args import ConfigError


def minimal(**extra: Any) -> dict[str, Any]:
    return {"model": {"path": "org/some-model", "max_model_len": 2048}, **extra}


def test_minimal_dict_gets_defaults() -> None:
    args = parse_app_args(minimal())
    assert isinstance(args, AppArgs)
    assert args.model.path == "org/some-model"  # a hub id: no such local path, left as given
    assert args.model.name == "some-model"
    assert args.model.tokenizer_path == "org/some-model"
    assert args.model.max_model_len == 2048
    assert args.model.trust_remote_code is False
    assert args.engine.dtype == "auto"
    assert args.engine.max_num_seqs == 256
    assert args.tokenizer.threads == 2
    assert (args.limits.max_n, args.limits.max_logprobs, args.limits.max_prompts_per_request) == (16, 20, 64)
    assert (args.health.poll_interval_s, args.health.timeout_s) == (2.0, 5.0)


def test_served_model_name_and_tokenizer_override() -> None:
    raw = {"model": {"path": "org/m/", "served_model_name": "chat", "tokenizer": "org/tok", "max_model_len": 64}}
    args = parse_app_args(raw)
    assert args.model.name == "chat"
    assert args.model.tokenizer_path == "org/tok"


def test_name_defaults_to_last_path_component_without_trailing_slash() -> None:
    args = parse_app_args({"model": {"path": "org/my-model/", "max_model_len": 64}})
    assert args.model.name == "my-model"


def test_app_args_instance_is_returned_unchanged() -> None:
    args = parse_app_args(minimal())
    assert parse_app_args(args) is args


def test_args_are_frozen() -> None:
    args = parse_app_args(minimal())
    with pytest.raises(ValidationError):
        args.model.max_model_len = 4096


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"model": {"path": "m", "max_model_len": 1}}, "model.max_model_len"),
        ({"model": {"path": "", "max_model_len": 64}}, "model.path"),
        (minimal(unknown=1), "unknown"),
        ({"model": {"path": "m", "max_model_len": 64, "colour": "red"}}, "model.colour"),
        (minimal(engine={"dtype": "int3"}), "engine.dtype"),
        (minimal(engine={"gpu_memory_utilization": 0.0}), "engine.gpu_memory_utilization"),
        (minimal(tokenizer={"threads": 0}), "tokenizer.threads"),
        (minimal(limits={"max_n": 0}), "limits.max_n"),
        (minimal(health={"timeout_s": 0}), "health.timeout_s"),
        ({}, "model"),
        # strict types: a quoted "yes" must not turn on remote code, nor a string pass as a number
        ({"model": {"path": "m", "max_model_len": 64, "trust_remote_code": "yes"}}, "model.trust_remote_code"),
        ({"model": {"path": "m", "max_model_len": "4096"}}, "model.max_model_len"),
        (minimal(engine={"seed": 2**63}), "engine.seed"),
        (minimal(engine={"stream_interval_ms": -1}), "engine.stream_interval_ms"),
        (minimal(multimodal={"fetch": {"allowed_hosts": ["10.0.0.0/33"]}}), "multimodal.fetch.allowed_hosts"),
        (minimal(multimodal={"fetch": {"allowed_hosts": ["exa mple"]}}), "multimodal.fetch.allowed_hosts"),
    ],
)
def test_bad_value_names_the_dotted_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_app_args(raw)
    message = str(info.value)
    assert message.startswith(f"invalid application args: {field}: ")
    assert isinstance(info.value.__cause__, ValidationError)


def test_every_bad_field_is_named() -> None:
    raw = minimal(engine={"dtype": "int3"}, tokenizer={"threads": 0})
    with pytest.raises(ConfigError) as info:
        parse_app_args(raw)
    problems = str(info.value).removeprefix("invalid application args: ").split("; ")
    assert [p.split(":")[0] for p in problems] == ["engine.dtype", "tokenizer.threads"]


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_relative_existing_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "toks" / "t").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    args = parse_app_args({"model": {"path": "models/m", "tokenizer": "toks/t", "max_model_len": 64}})
    assert args.model.path == str(tmp_path.resolve() / "models" / "m")
    assert args.model.tokenizer == str(tmp_path.resolve() / "toks" / "t")
    assert Path(args.model.path).is_absolute()
    assert args.model.name == "m"


def test_relative_missing_path_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = parse_app_args({"model": {"path": "org/model", "max_model_len": 64}})
    assert args.model.path == "org/model"
    assert args.model.tokenizer is None
