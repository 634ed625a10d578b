"""Helpers every endpoint's response uses: request ids and per-stage timing headers."""

from __future__ import annotations

import uuid


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# The header of each stage time a response reports, in pipeline order (the bench reads them back,
# load/bench/sse.py). X-Multimodal-Time only comes with images, X-Vocoder-First-Chunk-Time only with
# speech; X-Total-Time only with non-streamed responses (a streamed one's headers leave first).
TIMING_HEADERS = {
    "multimodal": "X-Multimodal-Time",
    "tokenizer": "X-Tokenizer-Time",
    "llm_first_chunk": "X-LLM-First-Chunk-Time",  # from the ingress's call to the llm stage's first chunk
    "llm_engine": "X-LLM-Engine-Time",  # the engine's part of that: queue and prefill, inside the llm stage
    "first_token": "X-First-Token-Time",  # from the start of the request's stages (images too) to the first chunk
    "vocoder_first_chunk": "X-Vocoder-First-Chunk-Time",
    "total": "X-Total-Time",
}


def timing_headers(timings: dict[str, float]) -> dict[str, str]:
    """Per-stage time in milliseconds, as `X-<Stage>-Time` headers."""
    return {TIMING_HEADERS[k]: f"{v * 1000:.3f}" for k, v in timings.items() if k in TIMING_HEADERS}
