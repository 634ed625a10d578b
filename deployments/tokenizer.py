"""Tokenizer deployment: `TokenizerStage` in its own replicas, off the ingress's event loop."""

from __future__ import annotations

from ray import serve

from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.config import AppArgs
from serve_app.messages import TokenizedPrompt, TokenizeRequest
from serve_app.stages.tokenizer import TokenizerStage


@serve.deployment(name="tokenizer", max_ongoing_requests=64, max_queued_requests=256,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
class Tokenizer:
    def __init__(self, args: AppArgs) -> None:
        self._stage = TokenizerStage.from_args(args)

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        return await self._stage.tokenize_async(request)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await self._stage.detokenize_async(token_ids)

    def speech_layout(self) -> OrpheusLayout | None:
        return self._stage.speech_layout

    async def ping(self) -> None:
        return None

    def __del__(self) -> None:
        self._stage.close()
