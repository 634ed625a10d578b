"""`/v1/audio/speech` request model: OpenAI's fields, as vLLM-Omni also accepts them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from serve_app.audio_formats import ResponseFormat
from serve_app.ingress.protocol import OpenAIRequest


class SpeechRequest(OpenAIRequest):
    model: str | None = Field(default=None, description="Served model name; the only one when omitted.")
    input: str = Field(min_length=1, description="The text to speak.")
    voice: str | None = Field(
        default=None, min_length=1, description="One of `GET /v1/audio/voices`; the first of them when omitted."
    )
    response_format: ResponseFormat = Field(
        default="mp3",
        description="`mp3` (OpenAI's default), `opus` (in Ogg), `aac` (ADTS), `flac`, `wav` (16-bit mono), or "
        "`pcm` (raw 16-bit little-endian mono samples); all at the model's sample rate.",
    )
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream: bool = Field(default=False, description="Send audio as it is produced (chunked transfer).")
    stream_format: Literal["audio", "sse"] = Field(
        default="audio",
        description="Raw audio bytes (streamed with `stream`), or SSE `speech.audio.delta` events with base64 "
        "audio, which stream with or without `stream` (OpenAI's API has no `stream` field: `sse` alone asks for them).",
    )
    instructions: str | None = None

    def streams(self) -> bool:
        """Whether the audio goes out as it is made."""
        return self.stream or self.stream_format == "sse"

    @field_validator("input")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must contain text to speak")
        return value

    @field_validator("speed")
    @classmethod
    def _normal_speed(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError("speed other than 1.0 is not supported by this model")
        return value

    @field_validator("instructions")
    @classmethod
    def _no_instructions(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("instructions are not supported by this model")
        return value


class VoiceList(BaseModel):
    """`GET /v1/audio/voices`, in vLLM-Omni's shape."""

    voices: list[str] = Field(
        description="The voices `voice` may name, in the config's order; the first is the default."
    )
    uploaded_voices: list[dict[str, Any]] = Field(
        default_factory=list, description="Always empty: this server takes no voice uploads. vLLM-Omni clients read it."
    )
