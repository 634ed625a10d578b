"""`/tokenize` and `/detokenize` models, as in vLLM's OpenAI server."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from serve_app.ingress.protocol import ChatMessage, ChatTemplateKwargs, OpenAIRequest


class TokenizeRequest(OpenAIRequest):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: ChatTemplateKwargs | None = None
    return_token_strs: bool = Field(default=False, description="Each token's string in `token_strs` too.")

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIRequest):
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


class DetokenizeResponse(BaseModel):
    prompt: str
