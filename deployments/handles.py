"""`serve_app.ingress.clients` over Ray Serve deployment handles."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.errors import OverloadedError
from serve_app.messages import (
    AudioChunk,
    GenerateRequest,
    GenerationChunk,
    ImagesRequest,
    ProcessedImages,
    TokenizedPrompt,
    TokenizeRequest,
    VocodeRequest,
)


def _overloaded(stage: str, exc: BackPressureError) -> OverloadedError:
    return OverloadedError(f"The {stage} stage is at capacity; retry later. ({exc})", code="overloaded")


class _UnaryHandle:
    """A stage called one request, one response; a full stage becomes a 503 with Retry-After."""

    stage = ""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(*args)
        except BackPressureError as exc:
            raise _overloaded(self.stage, exc) from exc

    async def check_health(self) -> None:
        await self._call("ping")


class HandleTokenizer(_UnaryHandle):
    stage = "tokenizer"

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        result: TokenizedPrompt = await self._call("tokenize", request)
        return result

    async def detokenize(self, token_ids: list[int]) -> str:
        return str(await self._call("detokenize", token_ids))

    async def speech_layout(self) -> OrpheusLayout | None:
        layout: OrpheusLayout | None = await self._call("speech_layout")
        return layout


class HandleMultimodal(_UnaryHandle):
    stage = "multimodal"

    async def process(self, request: ImagesRequest) -> ProcessedImages:
        result: ProcessedImages = await self._call("process", request)
        return result


class HandleVocoder(_UnaryHandle):
    stage = "vocoder"

    async def decode(self, request: VocodeRequest) -> AudioChunk:
        result: AudioChunk = await self._call("decode", request)
        return result


class HandleLLM:
    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self._handle = handle
        self._stream = handle.options(stream=True)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        try:
            response = self._stream.generate.remote(request)
            # options(stream=True) makes this a generator; Serve's return type is a union.
            assert isinstance(response, DeploymentResponseGenerator)
            async for chunk in response:
                yield chunk
        except BackPressureError as exc:
            raise _overloaded("llm", exc) from exc

    async def check_health(self) -> None:
        try:
            await self._handle.ping.remote()
        except BackPressureError:
            # Rejected by full queues means replicas are up and working, not dead; admission control
            # reports the overload to the requests themselves.
            return

    async def metrics_text(self) -> str:
        return str(await self._handle.metrics_text.remote())
