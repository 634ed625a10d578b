"""The ingress app (real tokenizer stage, FakeLLM) and a stand-in speech server, served on a real port,
for the bench and locust tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse

from load.ports import free_port
from serve_app.config import parse_app_args
from serve_app.ingress.pipeline.clients import LLMClient
from serve_app.ingress.pipeline.services import Services
from serve_app.stages.multimodal import MultimodalStage
from serve_app.stages.tokenizer import TokenizerStage

VISION_MODEL = "tiny-llava"
SPEECH_MODEL = "tiny-orpheus"
SAMPLE_RATE = 24000


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Runs `app` (lifespan included: /health answers 200) in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def vision_services(model_path: Path, llm: LLMClient) -> Services:
    """The tiny LLaVA's real multimodal and tokenizer stages in process, with `llm` (a FakeLLM) behind
    them; the stages close with the app's lifespan."""
    args = parse_app_args({
        "model": {"path": str(model_path), "served_model_name": VISION_MODEL, "max_model_len": 256},
        "tokenizer": {"threads": 1},
        "multimodal": {"threads": 1},
    })  # fmt: skip
    tokenizer = TokenizerStage.from_args(args)
    images = MultimodalStage.from_args(args)
    services = Services.create(args, tokenizer, llm, images)
    services.closers += [tokenizer.close, images.close]
    return services


class FakeSpeech:
    """A `/v1/audio/speech` server as the graph's TTS app answers: `chunks` chunks of `chunk_s` seconds of
    PCM silence, one every `gap_s` (faster than real time when `gap_s < chunk_s`), stage headers, and
    503 with Retry-After beyond `max_streams` streams at once. Records the request bodies."""

    def __init__(self, chunks: int = 4, chunk_s: float = 0.05, gap_s: float = 0.01, max_streams: int = 64) -> None:
        self.chunk = bytes(round(chunk_s * SAMPLE_RATE) * 2)
        self.chunks, self.gap_s, self.max_streams = chunks, gap_s, max_streams
        self.bodies: list[dict[str, Any]] = []
        self.streams = 0
        self.app = FastAPI()
        self.app.get("/health")(lambda: Response())
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": SPEECH_MODEL, "object": "model"}]})
        self.app.post("/v1/audio/speech")(self.speech)

    async def speech(self, body: dict[str, Any]) -> Response:
        self.bodies.append(body)
        if self.streams >= self.max_streams:
            error = {"message": "at capacity", "type": "ServiceUnavailable", "code": 503}
            return JSONResponse({"error": error}, status_code=503, headers={"Retry-After": "1"})
        self.streams += 1
        headers = {"X-Audio-Sample-Rate": str(SAMPLE_RATE), "X-Tokenizer-Time": "1.5",
                   "X-LLM-First-Chunk-Time": "4.0", "X-Vocoder-First-Chunk-Time": "2.5"}  # fmt: skip
        return StreamingResponse(self.pcm(), media_type="audio/pcm", headers=headers)

    async def pcm(self) -> AsyncIterator[bytes]:
        try:
            for _ in range(self.chunks):
                await asyncio.sleep(self.gap_s)
                yield self.chunk
        finally:
            self.streams -= 1
