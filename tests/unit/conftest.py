"""Shared setup of the unit tests: the tiny model, app args, a real tokenizer stage and a fake LLM.

Nothing here starts Ray or a vLLM engine: the stages are called in-process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from fastapi.testclient import TestClient

from serve_app.config import AppArgs, parse_app_args
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import (
    ChoiceDelta,
    GenerateRequest,
    GenerationChunk,
    TokenizedPrompt,
    TokenizeRequest,
    TokenLogprob,
)
from serve_app.models.tiny_chat import ensure_tiny_chat_model
from serve_app.models.tiny_llava import ensure_tiny_llava_model
from serve_app.stages.tokenizer import TokenizerStage

if TYPE_CHECKING:  # Serve is imported by the tests that build a deployment's class, not by every test
    from ray.serve import Deployment

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-chat"
MAX_MODEL_LEN = 128
MAX_N = 4
MAX_LOGPROBS = 5
MAX_PROMPTS = 8
# What FakeLLM "generates": token id and text of every generated token, and its logprob candidates.
FAKE_TOKEN_ID = 64
FAKE_EXPANDED = 99  # a prompt id only the engine has (FakeLLM, `return_prompt_ids`)
FAKE_CANDIDATES = [
    ("a", -0.5, [97]),
    ("b", -1.5, [98]),
    ("c", -2.5, [99]),
    ("d", -3.5, [100]),
    ("e", -4.5, [101]),
    ("f", -5.5, [102]),
]


def deployment_class(deployment: object) -> Any:
    """The class a Serve deployment wraps (under its decorators), to build or call in this process."""
    return cast("Deployment", deployment).func_or_class


class FakeLLM:
    """An `LLMClient` that answers every request deterministically from the GenerateRequest.

    Each of the `n` choices gets `max_tokens` tokens "a", one per chunk; the last chunk has
    finish_reason "length". With `logprobs=k` each token carries the first k of FAKE_CANDIDATES; with
    `prompt_logprobs=k` the first chunk carries each prompt token after the first as "<id>" at -1.0, with
    the first k of FAKE_CANDIDATES; with `return_prompt_ids`, it carries the prompt's ids followed by
    FAKE_EXPANDED, as if the engine had expanded an image: answers must carry the engine's ids.
    """

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.closed: list[str] = []  # request ids whose stream was closed before its end
        self.error: BaseException | None = None  # raised instead of the first chunk when set
        self.health_error: BaseException | None = None
        self.metrics_error: BaseException | None = None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        spec = request.sampling
        logprobs = None
        if spec.logprobs is not None:
            logprobs = [TokenLogprob("a", -0.5, [97], FAKE_CANDIDATES[: spec.logprobs])]
        prompt_logprobs = None
        if spec.prompt_logprobs is not None:
            top = FAKE_CANDIDATES[: spec.prompt_logprobs]
            prompt_logprobs = [TokenLogprob(f"<{t}>", -1.0, list(f"<{t}>".encode()), top)
                               for t in request.prompt_token_ids[1:]]  # fmt: skip
        try:
            for step in range(spec.max_tokens):
                last = step == spec.max_tokens - 1
                deltas = [
                    ChoiceDelta(i, "a", [FAKE_TOKEN_ID], "length" if last else None, None, logprobs)
                    for i in range(spec.n)
                ]
                logprobs_first = prompt_logprobs if step == 0 else None
                ids_first = [*request.prompt_token_ids, FAKE_EXPANDED] if spec.return_prompt_ids and step == 0 else None
                yield GenerationChunk(deltas, last, None, logprobs_first, ids_first)
        except GeneratorExit:
            self.closed.append(request.request_id)
            raise

    async def check_health(self) -> None:
        if self.health_error is not None:
            raise self.health_error

    async def metrics_text(self) -> str:
        if self.metrics_error is not None:
            raise self.metrics_error
        return "# TYPE fake_llm_up gauge\nfake_llm_up 1.0\n"


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return ensure_tiny_chat_model(REPO / "models" / "tiny-chat")


@pytest.fixture(scope="session")
def tiny_vision_model_path() -> Path:
    return ensure_tiny_llava_model(REPO / "models" / "tiny-llava")


@pytest.fixture(scope="session")
def raw_args(tiny_model_path: Path) -> dict[str, Any]:
    return {
        "model": {
            "path": str(tiny_model_path),
            "served_model_name": MODEL_NAME,
            "max_model_len": MAX_MODEL_LEN,
        },
        "tokenizer": {"threads": 2},
        "limits": {"max_n": MAX_N, "max_logprobs": MAX_LOGPROBS, "max_prompts_per_request": MAX_PROMPTS},
        # Long interval: after the first poll at startup, only the tests change the health state.
        "health": {"poll_interval_s": 60.0, "timeout_s": 5.0},
    }


@pytest.fixture(scope="session")
def app_args(raw_args: dict[str, Any]) -> AppArgs:
    return parse_app_args(raw_args)


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_model_path: Path) -> Any:
    """The model's Hugging Face tokenizer, used single-threaded to compute expected ids."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path))


@pytest.fixture(scope="session")
def tokenizer_stage(app_args: AppArgs) -> Iterator[TokenizerStage]:
    stage = TokenizerStage.from_args(app_args)
    yield stage
    stage.close()


@pytest.fixture(scope="module")
def vision_args(tiny_vision_model_path: Path) -> AppArgs:
    """The tiny LLaVA's app args; a module overrides this fixture for other limits or admission."""
    model = {"path": str(tiny_vision_model_path), "served_model_name": "tiny-llava", "max_model_len": 256}
    return parse_app_args({"model": model, "multimodal": {}})


@pytest.fixture(scope="module")
def vision_tokenizer(vision_args: AppArgs) -> Iterator[TokenizerStage]:
    """A tokenizer stage of the requesting module's `vision_args`."""
    stage = TokenizerStage.from_args(vision_args)
    yield stage
    stage.close()


@pytest.fixture
def fake_llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def services(app_args: AppArgs, tokenizer_stage: TokenizerStage, fake_llm: FakeLLM) -> Services:
    return Services.create(app_args, tokenizer_stage, fake_llm)


@pytest.fixture
def client(services: Services) -> TestClient:
    """The ingress app without its lifespan: the health monitor is not running."""
    return TestClient(create_app(services))


@pytest.fixture(scope="session")
def chat_ids(hf_tokenizer: Any) -> Any:
    """Expected prompt ids of a chat conversation, computed with the HF tokenizer directly."""

    def ids(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return list(hf_tokenizer.encode(text, add_special_tokens=False))

    return ids


@pytest.fixture
def sse_events() -> Any:
    """The events of an SSE response body: parsed JSON payloads, and the final "[DONE]" as a string."""

    def parse(body: str) -> list[Any]:
        assert body.endswith("\n\n")
        events = []
        for block in body.split("\n\n")[:-1]:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
        return events

    return parse


class Clock:
    """A clock for code that takes one (`clock=`), moved by the test: `clock.now += 1.5`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class HeldLLM(FakeLLM):
    """Sends its first chunk, then holds the stream open until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        first = True
        async for chunk in super().generate(request):
            yield chunk
            if first:
                first = False
                await self.release.wait()


class CountingTokenizer:
    """The tokenizer stage, counting its `tokenize` calls."""

    def __init__(self, stage: TokenizerStage) -> None:
        self._stage = stage
        self.calls = 0

    def __getattr__(self, method: str) -> Any:
        return getattr(self._stage, method)

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        self.calls += 1
        return await self._stage.tokenize(request)
