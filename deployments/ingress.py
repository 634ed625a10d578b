"""Ingress deployment: the FastAPI app of `serve_app.ingress`, wired to the stage deployments.

It parses, validates, admits and streams; the CPU-heavy work runs in the tokenizer and llm
deployments (and the multimodal and vocoder ones for images and speech), so this replica's event
loop stays free to answer `/health` under load.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.handles import HandleLLM, HandleMultimodal, HandleTokenizer, HandleVocoder
from serve_app.config import AppArgs
from serve_app.ingress.app import create_app
from serve_app.ingress.inline_tokenizer import InlineTokenizer
from serve_app.ingress.pipeline import Services


@serve.deployment(name="ingress", max_ongoing_requests=512, max_queued_requests=1024,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
@serve.ingress()
class Ingress:
    def __init__(
        self,
        args: AppArgs,
        tokenizer: DeploymentHandle[Any],
        llm: DeploymentHandle[Any],
        multimodal: DeploymentHandle[Any] | None = None,
        vocoder: DeploymentHandle[Any] | None = None,
    ) -> None:
        def stage_lost(stage: str, detail: str) -> None:
            # Called only once requests flow, after `self._services` exists.
            self._services.health.mark_failed(stage, detail)

        self._services = Services.create(
            args,
            InlineTokenizer.around(args, HandleTokenizer(tokenizer, stage_lost)),
            HandleLLM(llm, stage_lost),
            HandleMultimodal(multimodal, stage_lost) if multimodal is not None else None,
            HandleVocoder(vocoder, stage_lost) if vocoder is not None else None,
        )

    async def health_report(self) -> tuple[bool, dict[str, str]]:
        """For the graph's `/health` app: answered on this replica's event loop, so a hung ingress fails it."""
        return self._services.health.report()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self._services)
