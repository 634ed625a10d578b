"""`serve_app.ingress.pipeline.clients` over Ray Serve deployment handles.

A unary stage's client method calls the deployment's method of the same name; the ingress types it by
the client Protocol it passes the handle as.

A stage's health check is a call like any other: it takes one of the deployment's `max_ongoing_requests`
slots, or waits in its queue behind the very requests it checks on. So a stage whose calls from here
are making progress (answers, a stream's chunks) counts as alive without one: a busy stage neither
turns `/health` red by making the check wait past its timeout, nor loses a queue place a request needed.
For the llm stage any stream in flight from here stands for the check, making progress or not: a client
that reads slowly stalls its stream with nothing wrong in the stage, and each stream fails, reporting the
stage lost, when its replica dies or its engine dies or hangs (the llm stage's watchdog). A replica whose
own event loop hangs with streams in flight is then left to Serve's health checks of its replicas.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from grpc import StatusCode
from grpc.aio import AioRpcError
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from serve_app.errors import (
    EngineDeadError,
    OpenAIError,
    OverloadedError,
    PayloadTooLargeError,
    StageUnavailableError,
    chunks_sent_before,
    find_openai_error,
)
from serve_app.ingress.pipeline.clients import LLMClient, MultimodalClient, TokenizerClient, VocoderClient
from serve_app.messages import GenerateRequest, GenerationChunk
from serve_app.token_channel import Inbox


def _overloaded(stage: str, exc: BackPressureError) -> OverloadedError:
    return OverloadedError(
        f"The {stage} stage is at capacity; retry later. ({exc})", code="overloaded", stage=stage, reason="stage_full"
    )


# What a call raises when the replica serving it dies or drops off mid-call (ActorDiedError and, over
# Serve's gRPC transport, ActorUnavailableError are RayActorErrors; a unary gRPC call whose replica died
# after accepting it surfaces the raw AioRpcError, measured). Ray's own message names an actor id, not a
# stage, and the ingress would answer it with a 500.
_REPLICA_LOST = (RayActorError, ReplicaUnavailableError, DeploymentUnavailableError, AioRpcError)

# Told (stage, detail) when a call finds its stage broken, so `/health` turns red at once.
OnStageLost = Callable[[str, str], None]


def _stage_lost(stage: str, exc: BaseException, on_lost: OnStageLost | None) -> OpenAIError:
    """What one of `_REPLICA_LOST` raised by a call to `stage` means for the client."""
    if isinstance(exc, AioRpcError) and exc.code() == StatusCode.RESOURCE_EXHAUSTED:
        # Over Serve's gRPC transport a replica receives at most RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
        # (4 MiB by default): a bigger message is the request's fault, not a lost replica.
        return PayloadTooLargeError(
            f"The request is too large to pass to the {stage} stage ({exc.details()}); send a smaller one, "
            "or raise RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH where the cluster starts.",
            code="request_too_large",
        )
    detail = f"replica lost mid-call: {type(exc).__name__}"
    if on_lost is not None:
        on_lost(stage, detail)
    return StageUnavailableError(
        f"The {stage} stage failed during the request ({detail}); it is being restarted, retry shortly.",
        code="stage_unavailable",
    )


# Put among a stream's chunks when its `generate_to` call has answered.
_ANSWERED = object()
# How long the chunks a `generate_to` call sent may take to arrive after its answer.
LATE_CHUNKS_S = 10.0


def _answered(arrivals: asyncio.Queue[Any], answer: asyncio.Future[Any]) -> None:
    """Marks the end of a stream's chunks; its outcome is read here once (so that asyncio does not log the
    cancellation of a call left early as lost) and again by the stream, if it is still read."""
    if not answer.cancelled():
        answer.exception()
    arrivals.put_nowait(_ANSWERED)


async def _late_chunk(arrivals: asyncio.Queue[Any], number: int, sent: int, error: BaseException | None) -> Any:
    """Chunk `number` of the `sent` a call answered it sent, waited for at most `LATE_CHUNKS_S`; if it does not
    come, the call's `error` (an error the client should see, not the lost chunks), else a 503."""
    if not arrivals.empty():
        return arrivals.get_nowait()
    try:
        return await asyncio.wait_for(arrivals.get(), LATE_CHUNKS_S)
    except TimeoutError as exc:
        if error is not None:
            raise error from error.__cause__  # as it came: an error it wraps may be what the client sees
        raise StageUnavailableError(
            f"The llm stage sent {sent} chunks and {number - 1} arrived over the token channel; retry.",
            code="stage_unavailable",
        ) from exc


@contextmanager
def _stage_errors(stage: str, on_lost: OnStageLost | None) -> Iterator[None]:
    """A call's Serve errors as the client's: a full stage is a 503 to retry, a lost replica a 503 reported."""
    try:
        yield
    except BackPressureError as exc:
        raise _overloaded(stage, exc) from exc
    except _REPLICA_LOST as exc:
        raise _stage_lost(stage, exc, on_lost) from exc


# How long a scrape of the llm stage's metrics waits for a slot before it answers from the last one.
METRICS_WAIT_S = 1.0
# How recent the progress of a call in flight must be to stand for a health check (see the module's doc).
PROGRESS_FRESH_S = 1.0


class Progress:
    """The calls to one stage in flight from here, and when one last made progress."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.at = -math.inf

    def made(self) -> None:
        self.at = time.monotonic()

    def shows_alive(self) -> bool:
        return self.in_flight > 0 and time.monotonic() - self.at < PROGRESS_FRESH_S


class _UnaryHandle:
    """A stage called one request, one response; a full stage becomes a 503 with Retry-After.

    Each method of the stage's client Protocol (`client`, from `clients.py`) is a call to the deployment's
    method of the same name (`__getattr__`): a method added to the Protocol and the stage needs nothing
    here. Other names are not forwarded, so a typo fails here, not in the replica.
    """

    stage = ""
    client: ClassVar[type] = object

    def __init__(self, handle: DeploymentHandle[Any], on_lost: OnStageLost | None = None) -> None:
        self._handle = handle
        self._on_lost = on_lost
        self.progress = Progress()

    def __getattr__(self, method: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        if method.startswith("_") or not callable(getattr(self.client, method, None)):
            raise AttributeError(f"{type(self).__name__} has no {method!r}: not a method of {self.client.__name__}")
        return functools.partial(self._call, method)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.progress.in_flight += 1
        try:
            with _stage_errors(self.stage, self._on_lost):
                response = getattr(self._handle, method).remote(*args, **kwargs)
                try:
                    result = await response
                except asyncio.CancelledError:
                    # Left early (the request's deadline): stop the work in the replica too. Serve cancels
                    # a call by itself only when the whole HTTP request is cancelled (client disconnect).
                    response.cancel()
                    raise
                except Exception as exc:
                    if find_openai_error(exc) is not None:
                        self.progress.made()  # the stage answered, with a refusal
                    raise
                self.progress.made()
                return result
        finally:
            self.progress.in_flight -= 1

    async def check_health(self) -> None:
        # The deployment's `check_health`, the one Serve itself polls: a stage that answers is healthy.
        if self.progress.shows_alive():
            return
        try:
            await self._call("check_health")
        except OverloadedError as exc:
            # Queues full means replicas up and working, not dead (as for the llm stage): a stage whose
            # calls each take over a second (image fetches, long audio) would otherwise turn red when busy.
            if exc.reason != "stage_full":
                raise


class HandleTokenizer(_UnaryHandle):
    stage, client = "tokenizer", TokenizerClient


class HandleMultimodal(_UnaryHandle):
    stage, client = "multimodal", MultimodalClient


class HandleVocoder(_UnaryHandle):
    stage, client = "vocoder", VocoderClient


class _UnaryLLM(_UnaryHandle):
    stage, client = "llm", LLMClient


class HandleLLM:
    """Its streams and checks are its own; any other `LLMClient` method is a unary call (`_UnaryHandle`)."""

    def __init__(self, handle: DeploymentHandle[Any], inbox: Inbox, on_lost: OnStageLost | None = None) -> None:
        self._unary = _UnaryLLM(handle, on_lost)
        self._handle = handle
        self._inbox = inbox
        self._on_lost = on_lost
        self.in_flight = 0  # streams from here: any one stands for a health check (the module's doc)
        self._metrics = "", -math.inf

    def __getattr__(self, method: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        return getattr(self._unary, method)  # type: ignore[no-any-return]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        """The llm stage's `generate_to` call: its answer (how many chunks it sent, or its error) comes over
        Serve, its chunks over the token channel (`serve_app/token_channel.py`)."""
        reply_to, arrivals = await self._inbox.open()
        self.in_flight += 1
        try:
            with _stage_errors("llm", self._on_lost):
                response = self._handle.generate_to.remote(request, reply_to)
                answer = asyncio.ensure_future(response)
                answer.add_done_callback(functools.partial(_answered, arrivals))
                try:
                    received = 0
                    while (chunk := await arrivals.get()) is not _ANSWERED:
                        received += 1
                        yield chunk
                    # The last chunks may still be on their way: they left before the answer, by another path.
                    # An error the stage raised after chunks says how many it sent; Serve's (a lost replica), none.
                    error = answer.exception()
                    sent: int = answer.result() if error is None else chunks_sent_before(error)
                    while received < sent:
                        received += 1
                        yield await _late_chunk(arrivals, received, sent, error)
                    if error is not None:
                        raise error
                except (GeneratorExit, asyncio.CancelledError):
                    # Left before its end (deadline, a sibling prompt failed, the client went away): cancel the
                    # call in the replica now, which closes the engine's generator. Serve does that by itself
                    # only when the whole HTTP request is cancelled.
                    response.cancel()  # type: ignore[no-untyped-call]
                    raise
        except Exception as exc:
            # The engine died or hung (watchdog) after the first chunk: only this call sees it.
            error = find_openai_error(exc)
            if isinstance(error, EngineDeadError) and self._on_lost is not None:
                self._on_lost("llm", error.message[:300])
            raise
        finally:
            self._inbox.close(reply_to.key)
            self.in_flight -= 1

    async def check_health(self) -> None:
        if self.in_flight:
            return
        try:
            await self._handle.check_health.remote()
        except BackPressureError:
            # Rejected by full queues means replicas are up and working, not dead; admission control
            # reports the overload to the requests themselves.
            return

    async def metrics_text(self) -> str:
        """The engine's metrics; from the last call that got through when the stage is at capacity. Like a
        health check, the call takes a slot or a queue place: it waits at most `METRICS_WAIT_S` for one (and
        is then cancelled), so a scrape neither waits for a generation to end nor holds a request's place."""
        response = self._handle.metrics_text.remote()
        try:
            self._metrics = str(await asyncio.wait_for(response, METRICS_WAIT_S)), time.monotonic()
        except (TimeoutError, BackPressureError):
            response.cancel()  # type: ignore[no-untyped-call]
            text, at = self._metrics
            if not text:
                return "# llm stage at capacity: no metrics from it yet\n"
            return f"# llm stage at capacity: its metrics as of {time.monotonic() - at:.1f} s ago\n{text}"
        return self._metrics[0]
