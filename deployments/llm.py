"""LLM deployment: `LLMStage` (the vLLM engine) in its own replicas.

It is the stage class itself, as for the tokenizer. Ray Serve calls `check_health` periodically, and the
ingress's health poll calls it through its handle; an engine that died fails it, and Serve replaces the
replica.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import cast

from ray import serve

from serve_app.config import AppArgs
from serve_app.errors import mark_chunks_sent
from serve_app.messages import GenerateRequest, GenerationChunk, ReplyTo
from serve_app.stages.llm import LLMStage
from serve_app.token_channel import Outbox


@serve.deployment(name="llm", max_ongoing_requests=256, max_queued_requests=512,
                  health_check_period_s=5, health_check_timeout_s=30,
                  ray_actor_options={"num_cpus": 1})  # fmt: skip
class LLM(LLMStage):
    def __init__(self, args: AppArgs) -> None:
        super().__init__(*LLMStage.parts(args))
        # vLLM reads its environment variables on every access unless told to cache them, which its engine
        # core does once started. Its output handler here reads some for every output of every request
        # (4 % of this replica's Python samples at concurrency 32, docs/benchmarks-notes.md, stop 45); the
        # replica's environment does not change once its engine runs.
        from vllm import envs

        envs.enable_envs_cache()
        self._outbox = Outbox()

    async def generate_to(self, request: GenerateRequest, reply_to: ReplyTo) -> int:
        """`generate`, its chunks sent to `reply_to` over the token channel; how many it sent."""
        connection = await self._outbox.connection(reply_to)
        sent = 0
        try:
            # aclosing: a cancelled call (the client went away) aborts the request in the engine now. (`generate`
            # is an async generator; the client Protocol it shares with the ingress types it as an iterator.)
            async with aclosing(cast(AsyncGenerator[GenerationChunk, None], self.generate(request))) as chunks:
                async for chunk in chunks:
                    connection.send(reply_to.key, chunk)
                    sent += 1
                    await connection.wait_for_reader()
        except Exception as exc:
            # The engine died after some chunks, say, or a bug ended the call: the stream is to show them before
            # the error, which may reach the ingress before they do. On a broken connection none are on their way.
            connection.flush()
            if not connection.broken:
                mark_chunks_sent(exc, sent)
            raise
        return sent

    async def metrics_text(self) -> str:
        # vLLM registers its engine metrics in this process's default registry. Imported here: Serve
        # pickles this class by value, and the registry holds locks.
        from prometheus_client import REGISTRY, generate_latest

        return generate_latest(REGISTRY).decode()

    def __del__(self) -> None:
        try:
            self.shutdown()
        finally:
            self._outbox.close()
