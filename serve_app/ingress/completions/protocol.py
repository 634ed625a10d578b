"""`/v1/completions` request model."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field, PrivateAttr, model_validator

from serve_app.ingress.protocol import INT64_MAX, SamplingRequest
from serve_app.messages import SamplingSpec

# OpenAI's and vLLM's budget for a completion that sets none (chat's is what the context leaves).
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(
        default=DEFAULT_MAX_TOKENS, ge=0, le=INT64_MAX, description="0 only with `echo`: the prompt back, nothing new."
    )
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=INT64_MAX)
    suffix: str | None = None
    add_special_tokens: bool = True
    _echo_only: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _completion_fields(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of different from n is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.max_tokens == 0:
            if not self.echo:
                raise ValueError("max_tokens must be at least 1, got 0 (0 only with echo)")
            self._echo_only = True
            self.max_tokens = 1
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be an empty list")
        return self

    @property
    def echo_only(self) -> bool:
        """Whether the answer is the prompt alone (`max_tokens: 0` with `echo`): one token is generated
        and counted, as by vLLM, and not returned."""
        return self._echo_only

    def sampling_spec(self, max_tokens: int, logprobs: int | None) -> SamplingSpec:
        """As vLLM, `echo` with `logprobs` asks the engine for the prompt's logprobs too."""
        spec = super().sampling_spec(max_tokens, logprobs)
        return replace(spec, prompt_logprobs=logprobs) if self.echo and logprobs is not None else spec

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts, each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]
