"""The `args:` of the one application that serves every model behind one base URL, routed by `model`.

    args:
      auth: {...}        # the front door's, for every model
      models:            # each entry one model's AppArgs (serve_app/config.py): its stages, limits,
        - model: {...}   # admission and health
          ...

An `args:` in the single-model form (AppArgs itself, `auth` included) is read as a graph of one model.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from serve_app.config import AppArgs, AuthConfig, parse_app_args
from serve_app.strict_args import Strict, parse_args


class GraphArgs(Strict):
    """Everything `deployments.graph:build_app` needs for several models."""

    models: list[AppArgs] = Field(min_length=1, description="The models served, each with its own stages and limits.")
    auth: AuthConfig = Field(default_factory=AuthConfig, description="Optional API keys, for every model.")

    @model_validator(mode="before")
    @classmethod
    def _auth_once(cls, raw: Any) -> Any:
        for i, entry in enumerate(raw.get("models") or [] if isinstance(raw, dict) else []):
            if isinstance(entry, dict) and "auth" in entry:
                raise ValueError(f"models.{i}.auth: API keys are set once for every model, as `auth` beside `models`")
        return raw

    @model_validator(mode="after")
    def _names(self) -> GraphArgs:
        seen: set[str] = set()
        for i, args in enumerate(self.models):
            name = args.model.name
            if name in seen:
                raise ValueError(f"models.{i}.model.served_model_name: `{name}` is served twice; names must differ")
            if "#" in name:  # Ray Serve refuses it in deployment names, which are made from it
                raise ValueError(f"models.{i}.model.served_model_name: `{name}` must not contain '#'")
            seen.add(name)
        return self


# Each model's stage deployments (multimodal and vocoder only for a model with those blocks).
STAGES = ("tokenizer", "llm", "multimodal", "vocoder")


def deployment_name(model: str, stage: str) -> str:
    """The deployment of `model`'s `stage` in a `models:` graph, as the YAML's `deployments:` names it."""
    return f"{model}-{stage}"


def parse_graph_args(raw: dict[str, Any] | AppArgs | GraphArgs) -> GraphArgs:
    """`args:` with a `models:` list, or one model's AppArgs (its `auth` becomes the graph's); a
    ConfigError naming the bad field otherwise."""
    if isinstance(raw, GraphArgs):
        return raw
    if isinstance(raw, AppArgs) or "models" not in raw:
        single = parse_app_args(raw)
        return GraphArgs(models=[single], auth=single.auth)
    return parse_args(GraphArgs, raw)
