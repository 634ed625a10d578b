"""Request and response models shared by the OpenAI endpoint families.

Strict and closed: a string where a number belongs, an unknown field or an out-of-range value is a
client mistake that OpenAI answers with 400, and so do we (see `app.py`'s validation handler).

Unknown fields are rejected as OpenAI does ("Unrecognized request argument"), not ignored as vLLM's
server does: a misspelt `max_token` or `temprature` silently ignored gives the client a different
request than it asked for. The vLLM extensions we implement are declared fields, so they still work.
NaN and infinity (Python's JSON parser accepts `NaN`, `Infinity` and overflowing `1e400`) are
rejected everywhere, and so is text that is not valid Unicode (lone surrogates from `\ud800`
escapes), which the tokenizers cannot encode. `null` is not a wrong type for a field with a default:
it is that default, as OpenAI and vLLM read it.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from serve_app.messages import SamplingSpec

INT64_MAX = 2**63 - 1


def _null_in_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The JSON schema (OpenAPI) says what `_null_is_the_default` takes: `null` for a field with a default."""
    properties = schema.get("properties", {})
    for name in _defaulted_fields(model):
        accepted = properties.get(name)
        if accepted is not None and {"type": "null"} not in accepted.get("anyOf", []):
            outer = {key: accepted.pop(key) for key in ("title", "description", "default") if key in accepted}
            properties[name] = {"anyOf": [accepted, {"type": "null"}], **outer}


class OpenAIModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, json_schema_extra=_null_in_schema)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """`null` for a field with a default is that default, as in OpenAI's API and vLLM's (which declares
        such fields optional): clients send the options they leave unset as null (`"stream": null`)."""
        if isinstance(data, dict) and None in data.values():
            defaulted = _defaulted_fields(cls)
            return {key: value for key, value in data.items() if value is not None or key not in defaulted}
        return data


@cache
def _defaulted_fields(model: type[BaseModel]) -> frozenset[str]:
    """The names of `model`'s fields whose default is not None."""
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if field.default_factory is not None or (not field.is_required() and field.default is not None)
    )


def _invalid_text(value: Any, path: str) -> str | None:
    """The path of the first string in `value` that UTF-8 cannot encode, if any."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode()
        except UnicodeEncodeError:
            return path or "<body>"
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _invalid_text(key, path) or _invalid_text(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


class OpenAIRequest(OpenAIModel):
    """A whole request body: its text is checked once here, before any field is validated."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        path = _invalid_text(data, "")
        if path is not None:
            raise ValueError(f"{path}: text is not valid Unicode (a lone surrogate)")
        return data


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(
        default=False, description="vLLM's extension: with include_usage, every chunk also carries the usage so far."
    )


class SamplingRequest(OpenAIRequest):
    """Fields common to chat and text completions: OpenAI's, plus vLLM's usual extensions."""

    model: str | None = Field(default=None, description="Served model name; the only one when omitted.")
    max_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    n: int = Field(default=1, ge=1, le=INT64_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX, description="0 or -1: all tokens (vLLM's).")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT64_MAX)]] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    min_tokens: int = Field(default=0, ge=0, le=INT64_MAX)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = Field(
        default=0, ge=-(2**63), le=INT64_MAX,
        description="vLLM's extension: with the model's `engine.scheduling_policy: priority`, lower values are "
        "scheduled first (0 for every request by default); any other value is refused by an engine that "
        "schedules in arrival order. The body field only (not vLLM's `X-Vllm-Priority` header); admission "
        "and the stages before the engine treat every priority alike.",
    )  # fmt: skip
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = Field(
        default=None, description="Keep only the last k prompt tokens; -1: max_model_len - 1, leaving room for one."
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    return_token_ids: bool | None = Field(
        default=None,
        description="vLLM's extension: the prompt's token ids and each choice's generated ones beside the text "
        "(streamed: the prompt's in a choice's first chunk, the new ones in each).",
    )

    @model_validator(mode="after")
    def _check(self) -> SamplingRequest:
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be -1 or at least 1")
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")  # `{}` is allowed, as by vLLM
        return self

    def usage_in_stream(self) -> tuple[bool, bool]:
        """Whether a stream ends with a usage chunk, and whether every chunk carries the usage so far
        (vLLM: `continuous_usage_stats` only together with `include_usage`)."""
        options = self.stream_options or StreamOptions()
        return options.include_usage, options.include_usage and options.continuous_usage_stats

    @property
    def budget_param(self) -> str:
        """The field the client set `max_tokens` with, for errors that name it."""
        return "max_tokens"

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def sampling_spec(self, max_tokens: int, logprobs: int | None) -> SamplingSpec:
        return SamplingSpec(
            max_tokens=max_tokens,
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            stop=self.stop_list(),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logprobs=logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            priority=self.priority,
            return_prompt_ids=bool(self.return_token_ids),
        )


# `apply_chat_template`'s own parameters: passed as template variables they would let a client swap in
# its own Jinja template (`chat_template`), tools or tokenization options. vLLM refuses them too.
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "chat_template", "conversation", "tools", "documents", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "add_generation_prompt", "continue_final_message",
})  # fmt: skip


def _template_variables(kwargs: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ValueError(f"{', '.join(reserved)} cannot be set through chat_template_kwargs")
    return kwargs


ChatTemplateKwargs = Annotated[dict[str, Any], AfterValidator(_template_variables)]


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
        if isinstance(self.content, list) and not self.content:
            raise ValueError("content must not be an empty list")
        return self


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A response's `usage` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "serve-graph"
    root: str | None = None
    max_model_len: int | None = None
    # Not in OpenAI's card (clients ignore unknown fields): what the model serves behind this base URL.
    capabilities: list[str] = Field(
        default_factory=list, description="Of chat, completions, vision (image inputs), speech (/v1/audio/speech)."
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
