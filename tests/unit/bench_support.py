"""The ingress app (real tokenizer stage, FakeLLM) served on a real port, for the bench and locust tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from load.bench.targets import free_port
from serve_app.config import parse_app_args
from serve_app.ingress.clients import LLMClient, LocalMultimodal, LocalTokenizer
from serve_app.ingress.pipeline import Services
from serve_app.stages.multimodal import MultimodalStage
from serve_app.stages.tokenizer import TokenizerStage

VISION_MODEL = "tiny-llava"


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
    services = Services.create(args, LocalTokenizer(tokenizer), llm, LocalMultimodal(images))
    services.closers += [tokenizer.close, images.close]
    return services
