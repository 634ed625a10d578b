"""load/serve_config.py's selection of one model of a config, and its command that prints it as a Serve config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from load.serve_config import main, parse_selection
from tests.unit.config_support import assert_deployments_are_the_builders


def test_the_text_app_alone_is_a_config_serve_runs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["configs/cpu-tiny.yaml@tiny-chat"])
    config = yaml.safe_load(capsys.readouterr().out)
    app, health = ServeDeploySchema.model_validate(config).applications
    assert health.args == {"applications": ["openai"]}
    assert [m["model"]["served_model_name"] for m in app.args["models"]] == ["tiny-chat"]
    assert app.args["models"][0]["model"]["path"] == "models/tiny-chat"  # as `make serve` finds it, from the root
    built = assert_deployments_are_the_builders(config["applications"][0])
    assert built == ["ingress", "tiny-chat-llm", "tiny-chat-tokenizer"]
    assert config["http_options"] == yaml.safe_load(Path("configs/cpu-tiny.yaml").read_text())["http_options"]


def test_an_unknown_name_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="no model or application 'nope'"):
        main(["configs/cpu-tiny.yaml@nope"])
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("arg", "config", "name"),
    [
        (None, "configs/cpu-tiny.yaml", None),
        ("configs/other.yaml", "configs/other.yaml", None),
        ("configs/cpu-tiny.yaml@tiny-llava", "configs/cpu-tiny.yaml", "tiny-llava"),
        ("@tiny-llava", "configs/cpu-tiny.yaml", "tiny-llava"),
    ],
)
def test_a_selection_is_a_config_and_a_name(arg: str | None, config: str, name: str | None) -> None:
    assert parse_selection(arg) == (config, name)


def test_without_an_argument_it_is_the_default_configs_first_model(capsys: pytest.CaptureFixture[str]) -> None:
    main([])
    (app, _) = yaml.safe_load(capsys.readouterr().out)["applications"]
    assert [m["model"]["served_model_name"] for m in app["args"]["models"]] == ["tiny-chat"]
