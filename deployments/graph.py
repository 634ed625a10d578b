"""The application builder: `import_path: deployments.graph:build_app` in a Serve config YAML.

    ingress ──(unary)──> multimodal   (only with a `multimodal:` block: vision models)
       ├────(unary)──> tokenizer
       ├────(unary)──> llm          (its chunks come back over the token channel)
       └────(unary)──> vocoder      (only with a `tts:` block: speech models)

One ingress for every model of `args.models` (serve_app/graph_args.py), which routes each request by
its `model`; each model has stages of its own, deployments named `<served_model_name>-<stage>`
(`tiny-chat-tokenizer`, `tiny-llava-multimodal`, ...), which the YAML's `deployments:` list
configures by those names. The single-model `args:` form keeps the bare stage names (`tokenizer`,
`llm`, ...), as configs written for one model per application have them.
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
from serve_app.config import AppArgs
from serve_app.graph_args import GraphArgs, deployment_name, parse_graph_args
from serve_app.strict_args import ConfigError

TRANSPORT_LIMIT_ENV = "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"


def build_app(args: dict[str, Any] | AppArgs | GraphArgs) -> Application:
    """Validate the YAML `args:` (fails naming the bad field) and bind the graph."""
    graph = parse_graph_args(args)
    for model in graph.models:
        check_transport_fits(
            model, constants.RAY_SERVE_USE_GRPC_BY_DEFAULT, constants.RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
        )
    prefixed = isinstance(args, GraphArgs) or (isinstance(args, dict) and "models" in args)
    stages = {model.model.name: bind_stages(model, prefixed) for model in graph.models}
    return cast(Deployment, Ingress).bind(graph, stages)


def bind_stages(args: AppArgs, prefixed: bool = True) -> dict[str, Application]:
    """One model's stage deployments, bound to its args; named `deployment_name(model, stage)`, or
    the bare stage name with `prefixed=False` (the single-model form)."""
    # `@serve.deployment` turns each class into a Deployment; mypy still sees the class.
    classes = {"tokenizer": Tokenizer, "llm": LLM}
    if args.multimodal is not None:
        classes["multimodal"] = Multimodal
    if args.tts is not None:
        classes["vocoder"] = Vocoder
    bound = {}
    for stage, cls in classes.items():
        deployment = cast(Deployment, cls)
        if prefixed:
            deployment = deployment.options(name=deployment_name(args.model.name, stage))
        bound[stage] = deployment.bind(args)
    return bound


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
            "of `ray start` (configs/ray.env sets 64 MiB), or lower limits.max_request_bytes"
        )
