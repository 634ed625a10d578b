"""Tokenizer deployment: `TokenizerStage` in its own replicas, off the ingress's event loop.

Its methods are the in-process client's (`LocalTokenizer`): the ingress's handle and the in-process
path run the same code, and a new method is written once for both.
"""

from __future__ import annotations

from ray import serve

from serve_app.config import AppArgs
from serve_app.stages.local import LocalTokenizer
from serve_app.stages.tokenizer import TokenizerStage


@serve.deployment(name="tokenizer", max_ongoing_requests=64, max_queued_requests=256,
                  ray_actor_options={"num_cpus": 0.5})  # fmt: skip
class Tokenizer(LocalTokenizer):
    def __init__(self, args: AppArgs) -> None:
        super().__init__(TokenizerStage.from_args(args))

    def __del__(self) -> None:
        self._stage.close()
