"""load/serve_config.py's command: one model of a config, as a Serve config of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve._private.build_app import build_app as serve_build
from ray.serve.schema import ServeDeploySchema

from deployments.graph import build_app
from load.serve_config import main


def test_the_text_app_alone_is_a_config_serve_runs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["configs/cpu-tiny.yaml@tiny-chat"])
    config = yaml.safe_load(capsys.readouterr().out)
    app, health = ServeDeploySchema.model_validate(config).applications
    assert health.args == {"applications": ["openai"]}
    assert [m["model"]["served_model_name"] for m in app.args["models"]] == ["tiny-chat"]
    assert app.args["models"][0]["model"]["path"] == "models/tiny-chat"  # as `make serve` finds it, from the root
    # Serve applies `deployments:` by name to what the builder binds: the same names, exactly.
    built = serve_build(build_app(app.args), name=app.name)
    assert sorted(d.name for d in built.deployments) == ["ingress", "tiny-chat-llm", "tiny-chat-tokenizer"]
    assert sorted(d["name"] for d in config["applications"][0]["deployments"]) == sorted(
        d.name for d in built.deployments
    )
    assert config["http_options"] == yaml.safe_load(Path("configs/cpu-tiny.yaml").read_text())["http_options"]


def test_an_unknown_name_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="no model or application 'nope'"):
        main(["configs/cpu-tiny.yaml@nope"])
    assert capsys.readouterr().out == ""
