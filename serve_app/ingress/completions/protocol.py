"""`/v1/completions` request model."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from serve_app.ingress.protocol import INT64_MAX, SamplingRequest

# OpenAI's and vLLM's budget for a completion that sets none (chat's is what the context leaves).
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=INT64_MAX)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=INT64_MAX)
    suffix: str | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens(cls, data: Any) -> Any:
        """`"max_tokens": null` is the default too, as in vLLM (left unset, so no limit names it)."""
        if isinstance(data, dict) and "max_tokens" in data and data["max_tokens"] is None:
            return {k: v for k, v in data.items() if k != "max_tokens"}
        return data

    @model_validator(mode="after")
    def _completion_fields(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of different from n is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.echo and self.logprobs is not None:
            raise ValueError("echo together with logprobs is not supported")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be an empty list")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts, each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]
