"""How every `args:` block is validated: strict models (an unknown or misspelt field is an error, the
result immutable) and one error that names each bad field, whatever the application."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ConfigError(ValueError):
    """Invalid application arguments; the message names every bad field."""


ArgsT = TypeVar("ArgsT", bound=BaseModel)


def parse_args(cls: type[ArgsT], raw: dict[str, Any] | ArgsT) -> ArgsT:
    """A YAML `args:` block as `cls`, or a ConfigError naming every bad field."""
    if isinstance(raw, cls):
        return raw
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<args>'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid application args: {problems}") from exc
