"""The single-process baseline: the same ingress app and stage classes, in one uvicorn process.

What a monolithic server does (tokenizer thread pool and engine client on the API server's event
loop), built from this project's own classes so comparisons isolate the architecture.
`python -m load.baseline --config configs/cpu-tiny.yaml --port 8001`
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn

from load.serve_config import DEFAULT_CONFIG, load_in_process
from serve_app.codecs.orpheus import OrpheusLayout
from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.clients import TokenizerClient
from serve_app.ingress.pipeline.services import Services
from serve_app.messages import TokenizedPrompt, TokenizeRequest
from serve_app.stages.llm import LLMStage
from serve_app.stages.multimodal import MultimodalStage
from serve_app.stages.tokenizer import TokenizerStage
from serve_app.stages.vocoder import VocoderStage


class LoopTokenizer:
    """Tokenizes on the event loop itself: a monolith before vLLM PR #10635."""

    def __init__(self, stage: TokenizerStage) -> None:
        self._stage = stage

    async def tokenize(self, request: TokenizeRequest) -> TokenizedPrompt:
        return self._stage.tokenize_sync(request)

    async def detokenize(self, token_ids: list[int]) -> str:
        return self._stage.detokenize_sync(token_ids)

    async def speech_layout(self) -> OrpheusLayout | None:
        return self._stage.layout

    async def check_health(self) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--app", default=None, help="model (or application) of the config (default: its first model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument(
        "--tokenize-on-loop", action="store_true", help="tokenize on the event loop (vLLM before the seed-002 fix)"
    )
    opts = parser.parse_args()
    args = load_in_process(opts.config, opts.app)

    llm = LLMStage.from_args(args)
    stage = TokenizerStage.from_args(args)
    tokenizer: TokenizerClient = LoopTokenizer(stage) if opts.tokenize_on_loop else stage
    images = MultimodalStage.from_args(args) if args.multimodal is not None else None
    vocoder = VocoderStage.from_args(args) if args.tts is not None else None
    services = Services.create(args, tokenizer, llm, images, vocoder)
    services.closers += [
        stage.close,
        llm.shutdown,
        *([images.close] if images else []),
        *([vocoder.close] if vocoder else []),
    ]
    server = uvicorn.Server(
        uvicorn.Config(create_app(services), host=opts.host, port=opts.port, log_level="warning", loop="asyncio")
    )
    asyncio.run(server.serve())


if __name__ == "__main__":
    main()
