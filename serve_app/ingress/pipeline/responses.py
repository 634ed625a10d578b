"""Helpers every endpoint's response uses: request ids and per-stage timing headers."""

from __future__ import annotations

import uuid


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def timing_headers(timings: dict[str, float]) -> dict[str, str]:
    """Per-stage time in milliseconds, as `X-<Stage>-Time` headers."""
    names = {"multimodal": "X-Multimodal-Time", "tokenizer": "X-Tokenizer-Time",
             "llm_first_chunk": "X-LLM-First-Chunk-Time", "llm_engine": "X-LLM-Engine-Time",
             "first_token": "X-First-Token-Time", "vocoder_first_chunk": "X-Vocoder-First-Chunk-Time",
             "total": "X-Total-Time"}  # fmt: skip
    return {names[k]: f"{v * 1000:.3f}" for k, v in timings.items() if k in names}
