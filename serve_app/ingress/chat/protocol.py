"""`/v1/chat/completions` request model."""

from __future__ import annotations

from pydantic import Field, model_validator

from serve_app.ingress.protocol import INT64_MAX, ChatMessage, ChatTemplateKwargs, SamplingRequest


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: ChatTemplateKwargs | None = None

    @model_validator(mode="after")
    def _chat_fields(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:  # 0 without logprobs asks for nothing: allowed, as by vLLM
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    @property
    def budget_param(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
