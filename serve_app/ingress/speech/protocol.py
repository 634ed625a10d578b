"""`/v1/audio/speech` request model: OpenAI's fields, as vLLM-Omni also accepts them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from serve_app.ingress.protocol import OpenAIRequest


class SpeechRequest(OpenAIRequest):
    model: str | None = Field(default=None, description="Served model name; the only one when omitted.")
    input: str = Field(min_length=1, description="The text to speak.")
    voice: str = Field(min_length=1, description="One of the voices in the config's `tts.voices`.")
    # OpenAI's mp3/opus/aac/flac need an encoder this server does not ship; asking for them is a 400.
    response_format: Literal["wav", "pcm"] = Field(
        default="wav", description="`wav` (16-bit mono), or `pcm` (raw 16-bit little-endian mono samples)."
    )
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream: bool = Field(default=False, description="Send audio as it is produced (chunked transfer).")
    stream_format: Literal["audio", "sse"] = Field(
        default="audio",
        description="With `stream`: raw audio bytes, or SSE `speech.audio.delta` events with base64 audio.",
    )
    instructions: str | None = None

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
