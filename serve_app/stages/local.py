"""The stages called in-process, as the ingress's clients (`serve_app/ingress/pipeline/clients.py`): for unit
tests and for the single-process baseline that the benchmarks compare the graph against.

The tokenizer, multimodal and vocoder deployments are these classes (they subclass them), and the
ingress's handles call their methods by name (`deployments/handles.py`): a new unary stage method is
the stage's code, its line in the client Protocol, its method here and one line in the handle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from serve_app.codecs.orpheus import OrpheusLayout
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
from serve_app.stages.llm import LLMStage
from serve_app.stages.multimodal import MultimodalStage
from serve_app.stages.tokenizer import TokenizerStage
from serve_app.stages.vocoder import VocoderStage


class LocalTokenizer:
    def __init__(self, stage: TokenizerStage) -> None:
        self._stage = stage

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        return await self._stage.tokenize_async(request)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await self._stage.detokenize_async(token_ids)

    async def speech_layout(self) -> OrpheusLayout | None:
        return self._stage.speech_layout

    async def check_health(self) -> None:
        return None


class LocalMultimodal:
    def __init__(self, stage: MultimodalStage) -> None:
        self._stage = stage

    async def process(self, request: ImagesRequest) -> ProcessedImages:
        return await self._stage.process(request)

    async def check_health(self) -> None:
        return None


class LocalVocoder:
    def __init__(self, stage: VocoderStage) -> None:
        self._stage = stage

    async def decode(self, request: VocodeRequest) -> AudioChunk:
        return await self._stage.decode_async(request)

    async def check_health(self) -> None:
        return None


class LocalLLM:
    def __init__(self, stage: LLMStage) -> None:
        self._stage = stage

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        return self._stage.generate(request)

    async def check_health(self) -> None:
        await self._stage.check_health()

    async def metrics_text(self) -> str:
        # In one process the engine's metrics are already in the ingress's registry.
        return ""
