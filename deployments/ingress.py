"""Ingress deployment: the FastAPI app of `serve_app.ingress`, wired to each model's stage deployments.

It parses, validates, admits, routes by `model` and streams; the CPU-heavy work runs in each model's
tokenizer and llm deployments (and the multimodal and vocoder ones for images and speech), so this
replica's event loop stays free to answer `/health` under load.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
from ray.serve.handle import DeploymentHandle

from deployments.handles import HandleLLM, HandleMultimodal, HandleTokenizer, HandleVocoder
from serve_app.config import AppArgs
from serve_app.graph_args import GraphArgs
from serve_app.ingress.app import create_app
from serve_app.ingress.gate.admin import admin_socket
from serve_app.ingress.gate.publisher import publish_forever
from serve_app.ingress.pipeline.inline_tokenizer import InlineTokenizer
from serve_app.ingress.pipeline.router import ModelRouter
from serve_app.ingress.pipeline.services import Services
from serve_app.token_channel import Inbox

# One model's stage handles by stage name: tokenizer and llm always, multimodal and vocoder if it has them.
StageHandles = dict[str, DeploymentHandle[Any]]

# Python runs a full collection once more than 10 middle-generation ones ran since the last, and only if
# the objects that reached the oldest generation since then are a quarter of those the last one left
# there. Serve freezes what a replica made while starting (RAY_SERVE_FREEZE_GC_ON_STARTUP), so after the
# first full collection that quarter is of a few thousand objects, and load always brings them: here,
# where every request in flight holds its objects, each full collection walked them all with the loop
# stalled (7-24 ms every 5-11 s at concurrency 8-32, 63 ms during a burst of 200; none freed anything:
# docs/benchmarks-notes.md, stop56). With 100, about a tenth as often.
FULL_COLLECTION_AFTER = 100


@serve.deployment(name="ingress", max_ongoing_requests=512, max_queued_requests=1024,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
@serve.ingress()
class Ingress:
    def __init__(self, args: GraphArgs, stages: dict[str, StageHandles]) -> None:
        collect_rarely()
        # One token inbox for every model's llm stage: its streams' chunks come to this replica's node address.
        inbox = Inbox(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        models = [self._services(model, stages[model.model.name], inbox) for model in args.models]
        self._router = ModelRouter(models, args.auth)
        # The rates of the admission gate in its node's HAProxy (serve_app/ingress/gate/), on this loop.
        socket = admin_socket(ray.get_runtime_context().get_node_id())
        self._gate = asyncio.get_running_loop().create_task(publish_forever(socket, models, self._at_root))

    @staticmethod
    async def _at_root() -> bool:
        """Whether this replica's application serves route `/`, as the controller says."""
        # Off the event loop (a blocking lookup), and bounded: a busy controller is asked again next second.
        controller = await asyncio.to_thread(ray.get_actor, SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        details: dict[str, Any] = await asyncio.wait_for(controller.get_serve_instance_details.remote(), 10)
        return bool(details["applications"][serve.get_replica_context().app_name]["route_prefix"] == "/")

    @staticmethod
    def _services(args: AppArgs, handles: StageHandles, inbox: Inbox) -> Services:
        services: Services | None = None

        def stage_lost(stage: str, detail: str) -> None:
            # Called only once requests flow, after `services` exists.
            assert services is not None
            services.health.mark_failed(stage, detail)

        # Stage messages and errors are importable classes, so the standard library's pickle serializes
        # them as well as Serve's default cloudpickle does, without its Python-level pickler: a third of the
        # cost (`load/message_cost.py`). Serve applies the option over its gRPC transport between replicas
        # (RAY_SERVE_THROUGHPUT_OPTIMIZED, configs/ray.env); over Ray's actor calls it has no effect.
        handles = {
            stage: handle.options(request_serialization="pickle", response_serialization="pickle")
            for stage, handle in handles.items()
        }
        multimodal, vocoder = handles.get("multimodal"), handles.get("vocoder")
        services = Services.create(
            args,
            InlineTokenizer.around(args, HandleTokenizer(handles["tokenizer"], stage_lost)),
            HandleLLM(handles["llm"], inbox, stage_lost),
            HandleMultimodal(multimodal, stage_lost) if multimodal is not None else None,
            HandleVocoder(vocoder, stage_lost) if vocoder is not None else None,
        )
        return services

    async def health_report(self) -> tuple[bool, dict[str, str]]:
        """For the graph's `/health` app: answered on this replica's event loop, so a hung ingress fails it."""
        return self._router.health_report()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self._router)


def collect_rarely() -> None:
    """Full collections in this process after FULL_COLLECTION_AFTER middle-generation ones; the younger
    generations' thresholds as they are."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
