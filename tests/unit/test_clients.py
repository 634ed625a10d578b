"""serve_app/ingress/pipeline/clients.py: the ingress reaches the stages through Protocols, without importing them."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest

from deployments.llm import LLM
from deployments.multimodal import Multimodal
from deployments.tokenizer import Tokenizer
from deployments.vocoder import Vocoder
from serve_app.ingress.pipeline.clients import LLMClient, MultimodalClient, TokenizerClient, VocoderClient
from serve_app.stages.llm import LLMStage
from serve_app.stages.multimodal import MultimodalStage
from serve_app.stages.tokenizer import TokenizerStage
from serve_app.stages.vocoder import VocoderStage

# What only the stages need: image decoding, the tokenizers, the engine, the codec.
STAGE_LIBRARIES = ("PIL", "transformers", "torch", "vllm", "snac")


def test_the_ingress_deployment_imports_no_stage_library() -> None:
    code = "import sys, deployments.ingress; print(' '.join(sorted(sys.modules)))"
    modules = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert "deployments.ingress" in modules
    assert [m for m in STAGE_LIBRARIES if m in modules] == []
    assert [m for m in modules if m.startswith("serve_app.stages")] == []


CLIENTS: dict[type, type] = {
    TokenizerClient: TokenizerStage,
    MultimodalClient: MultimodalStage,
    VocoderClient: VocoderStage,
    LLMClient: LLMStage,
}


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
def test_each_stage_class_is_its_client(client: type) -> None:
    # The in-process path and the deployment (a subclass of the stage) call these by the Protocol's names.
    stage = CLIENTS[client]
    for name, method in vars(client).items():
        if callable(method) and not name.startswith("_"):
            assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(getattr(stage, name)), name
            assert inspect.signature(method) == inspect.signature(getattr(stage, name)), name


@pytest.mark.parametrize(
    ("deployment", "stage"),
    [(Tokenizer, TokenizerStage), (Multimodal, MultimodalStage), (Vocoder, VocoderStage), (LLM, LLMStage)],
    ids=lambda d: getattr(d, "name", ""),
)
def test_each_deployment_is_its_stage_class(deployment: Any, stage: type) -> None:
    assert issubclass(deployment.func_or_class, stage)
