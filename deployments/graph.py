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
from ray.serve._private import constants

from deployments.ingress import Ingress
from deployments.llm import LLM
from deployments.multimodal import Multimodal
from deployments.tokenizer import Tokenizer
from deployments.vocoder import Vocoder
from serve_app.config import AppArgs, ConfigError, parse_app_args

TRANSPORT_LIMIT_ENV = "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"


def build_app(args: dict[str, Any] | AppArgs) -> Application:
    """Validate the YAML `args:` (fails naming the bad field) and bind the graph."""
    app_args = parse_app_args(args)
    check_transport_fits(
        app_args, constants.RAY_SERVE_USE_GRPC_BY_DEFAULT, constants.RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
    )
    # `@serve.deployment` turns each class into a Deployment; mypy still sees the class.
    ingress, tokenizer, llm, multimodal, vocoder = (
        cast(Deployment, d) for d in (Ingress, Tokenizer, LLM, Multimodal, Vocoder)
    )
    images = multimodal.bind(app_args) if app_args.multimodal is not None else None
    speech = vocoder.bind(app_args) if app_args.tts is not None else None
    return ingress.bind(app_args, tokenizer.bind(app_args), llm.bind(app_args), images, speech)


def check_transport_fits(args: AppArgs, grpc: bool, max_message_bytes: int) -> None:
    """A body the ingress accepts must fit through the hop to the next stage.

    In Serve's throughput mode (gRPC between replicas) a replica receives at most
    `RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH` bytes, 4 MiB unless set in the cluster's environment;
    the prompt or image of a larger body would reach the stage only to be refused there (a 413 naming
    the stage), so the mismatch is a configuration error, caught before anything is deployed.
    """
    limit = args.limits.max_request_bytes
    if grpc and limit > max_message_bytes:
        raise ConfigError(
            f"limits.max_request_bytes ({limit}) exceeds {TRANSPORT_LIMIT_ENV} ({max_message_bytes}), the "
            "largest message a replica accepts over gRPC: set the variable to at least that in the environment "
            "of `ray start` (the Makefile sets 64 MiB), or lower limits.max_request_bytes"
        )
