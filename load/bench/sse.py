"""Reading an OpenAI streaming response: which events carry content, the usage and errors.

Shared by the bench client (httpx on asyncio) and the locust users (requests on gevent), so both
time the first token and the gaps between tokens the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.ingress.pipeline.responses import TIMING_HEADERS

# Per-stage times the ingress reports, in milliseconds, in pipeline order: header -> stage.
STAGE_HEADERS = {header: stage for stage, header in TIMING_HEADERS.items()}


def stage_times_ms(headers: Mapping[str, str]) -> dict[str, float]:
    """The stage times present in `headers` (case-insensitive mappings, as httpx and requests give)."""
    return {stage: float(headers[header]) for header, stage in STAGE_HEADERS.items() if header in headers}


def _choice_text(choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, Mapping):  # chat completion chunk
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


@dataclass
class StreamState:
    """What one SSE stream said so far, fed line by line with the time since the request was sent."""

    content_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    done: bool = False

    def feed(self, line: str, elapsed_s: float) -> None:
        if not line.startswith("data:"):
            return  # event separators and SSE comments
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"invalid SSE payload: {data[:120]}"
            return
        if "error" in payload:
            error = payload["error"]
            self.error = str(error.get("message") if isinstance(error, Mapping) else error)
            return
        usage = payload.get("usage")
        if usage:  # with continuous_usage_stats every chunk has usage; the last one is the total
            self.prompt_tokens = int(usage["prompt_tokens"])
            self.output_tokens = int(usage["completion_tokens"])
        # Role-only chat chunks and the empty finish chunk carry no token: they would make TTFT
        # and the inter-token gaps look shorter than what a reader of the stream experiences.
        if any(_choice_text(c) for c in payload.get("choices") or []):
            self.content_times.append(elapsed_s)

    def failure(self) -> str | None:
        """Why the finished stream does not count as a successful request, or None."""
        if self.error is not None:
            return self.error
        if not self.done:
            return "stream ended without [DONE]"
        if self.output_tokens is None:
            return "no usage in stream (stream_options.include_usage ignored?)"
        if not self.content_times and not self.output_tokens:
            return "no content in stream"
        return None
