"""`/v1/chat/completions` request model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from serve_app.ingress.protocol import OpenAIModel, SamplingRequest


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ImageURL(OpenAIModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(OpenAIModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for role '{self.role}'")
        return self


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _chat_fields(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
