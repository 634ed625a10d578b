"""Tokenizer deployment: `TokenizerStage` in its own replicas, off the ingress's event loop.

It is the stage class itself: the ingress's handle calls the `TokenizerClient` methods by name
(`deployments/handles.py`), and the in-process path calls them on a `TokenizerStage`. A new method is
written once, in the stage, and declared in the client Protocol.
"""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.stages.tokenizer import TokenizerStage


@serve.deployment(name="tokenizer", max_ongoing_requests=64, max_queued_requests=256,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
class Tokenizer(TokenizerStage):
    def __init__(self, args: AppArgs) -> None:
        super().__init__(*TokenizerStage.parts(args))

    def __del__(self) -> None:
        self.close()
