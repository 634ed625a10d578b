"""How the ingress reaches the stages: what it needs of each, whatever the transport.

The stage classes (`serve_app/stages/`) implement them, and are called in-process (unit tests, the
single-process baseline that the benchmarks compare the graph against); each deployment is its stage's
class. `deployments/handles.py` implements them over Ray Serve handles, calling the deployment's method
of the same name. So a new unary stage method is written in the stage and declared here, and nothing
else changes. Nothing here imports a stage, so the ingress replica loads none of their libraries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

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


class TokenizerClient(Protocol):
    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt: ...

    async def detokenize(self, token_ids: list[int]) -> str: ...

    async def speech_layout(self) -> OrpheusLayout | None: ...

    async def check_health(self) -> None: ...


class MultimodalClient(Protocol):
    async def process(self, request: ImagesRequest) -> ProcessedImages: ...

    async def check_health(self) -> None: ...


class VocoderClient(Protocol):
    async def decode(self, request: VocodeRequest) -> AudioChunk: ...

    async def check_health(self) -> None: ...


class LLMClient(Protocol):
    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]: ...

    async def check_health(self) -> None: ...

    async def metrics_text(self) -> str: ...
