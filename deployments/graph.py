"""The application builder: `import_path: deployments.graph:build_app` in a Serve config YAML.

    ingress ──(unary)──> multimodal   (only with a `multimodal:` block: vision models)
       ├────(unary)──> tokenizer
       ├────(stream)─> llm
       └────(unary)──> vocoder      (only with a `tts:` block: speech models)

Each stage is a class in `serve_app/stages/`, a deployment in `deployments/`, a handle passed to the
ingress.
"""

from __future__ import annotations

from typing import Any, cast

from ray.serve import Application, Deployment

from deployments.ingress import Ingress
from deployments.llm import LLM
from deployments.multimodal import Multimodal
from deployments.tokenizer import Tokenizer
from deployments.vocoder import Vocoder
from serve_app.config import AppArgs, parse_app_args


def build_app(args: dict[str, Any] | AppArgs) -> Application:
    """Validate the YAML `args:` (fails naming the bad field) and bind the graph."""
    app_args = parse_app_args(args)
    # `@serve.deployment` turns each class into a Deployment; mypy still sees the class.
    ingress, tokenizer, llm, multimodal, vocoder = (
        cast(Deployment, d) for d in (Ingress, Tokenizer, LLM, Multimodal, Vocoder)
    )
    images = multimodal.bind(app_args) if app_args.multimodal is not None else None
    speech = vocoder.bind(app_args) if app_args.tts is not None else None
    return ingress.bind(app_args, tokenizer.bind(app_args), llm.bind(app_args), images, speech)
