"""The ingress's HTTP API: thin routes over the endpoint modules, OpenAI-shaped errors, metrics.

`create_app` takes its stages as `Services`, so the same app runs as the Ray Serve ingress
(`deployments/ingress.py`), in unit tests with in-process stages, and as a single-process baseline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.config import AppArgs
from serve_app.errors import (
    BadRequestError,
    OpenAIError,
    OverloadedError,
    error_body,
    error_response,
    find_openai_error,
)
from serve_app.ingress.admission import InFlightLimit
from serve_app.ingress.auth import ApiKeyAuth, load_keys
from serve_app.ingress.body_limit import BodySizeLimit
from serve_app.ingress.chat.protocol import ChatCompletionRequest
from serve_app.ingress.chat.serving import create_chat_completion
from serve_app.ingress.completions.protocol import CompletionRequest
from serve_app.ingress.completions.serving import create_completion
from serve_app.ingress.deadline import Deadline, request_deadline
from serve_app.ingress.early_admission import EarlyAdmission
from serve_app.ingress.paths import KNOWN_PATHS, route_path
from serve_app.ingress.pipeline import Services
from serve_app.ingress.protocol import ErrorResponse, ModelCard, ModelList
from serve_app.ingress.speech.protocol import SpeechRequest, VoiceList
from serve_app.ingress.speech.serving import create_speech, list_voices
from serve_app.ingress.tokenize import serving as tokenize_serving
from serve_app.ingress.tokenize.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from serve_app.ingress.work_admission import WorkGate

logger = logging.getLogger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}, 404: {"model": ErrorResponse},
    413: {"model": ErrorResponse}, 429: {"model": ErrorResponse},
    503: {"model": ErrorResponse}, 504: {"model": ErrorResponse},
}  # fmt: skip
# With `stream: true` the same routes answer server-sent events.
_STREAMING: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}},
    **_ERRORS,
}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    param = ".".join(loc) or None
    return (f"{param}: {first.get('msg')}" if param else str(first.get("msg"))), param


class _RequestMetrics:
    """Counts requests by endpoint and status, and those in flight (pure ASGI: streams stay intact)."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.metrics = services.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        endpoint = path if path in KNOWN_PATHS else "other"
        status = "disconnected"
        start = time.perf_counter()

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        gauge = self.metrics.in_flight.labels(endpoint)
        gauge.inc()
        try:
            await self.app(scope, receive, send_and_record)
        except Exception as exc:
            # Starlette answers these outside this middleware (the `Exception` handler below runs in
            # ServerErrorMiddleware), so record the status that handler will send.
            if status == "disconnected":
                error = find_openai_error(exc)
                status = str(error.status_code if error is not None else 500)
            raise
        finally:
            gauge.dec()
            self.metrics.requests.labels(endpoint, status).inc()
            if endpoint.startswith("/v1/"):
                self.metrics.stage_seconds.labels("total").observe(time.perf_counter() - start)


def create_app(services: Services) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        services.health.start()
        yield
        # uvicorn runs this on SIGTERM before it re-raises the signal: the last chance to stop an
        # in-process engine, whose child process would otherwise outlive us.
        await services.close()

    def render(error: OpenAIError) -> JSONResponse:
        if isinstance(error, OverloadedError):
            services.metrics.rejections.labels(error.stage, error.reason).inc()
        return error_response(error, services.args.admission)

    def gate_for(model: str | None) -> tuple[WorkGate, AppArgs] | None:
        if services.work is None or model not in (None, services.args.model.name):
            return None  # an unknown model is the route's 404
        return services.work, services.args

    app = FastAPI(title="serve-graph", summary="OpenAI-compatible serving graph on Ray Serve", lifespan=lifespan)
    # Outermost last: metrics see every answer; a request without a valid key takes no admission slot;
    # early admission buffers bodies the size limit already bounds.
    app.add_middleware(EarlyAdmission, gate_for=gate_for, render=render)
    app.add_middleware(BodySizeLimit, max_bytes=services.args.limits.max_request_bytes)
    app.add_middleware(InFlightLimit, limit=services.args.admission.max_in_flight, render=render)
    auth = services.args.auth
    app.add_middleware(
        ApiKeyAuth, keys=load_keys(auth), max_concurrent_per_key=auth.max_concurrent_per_key, render=render
    )
    app.add_middleware(_RequestMetrics, services=services)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return render(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(BadRequestError(message, param=param))

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own 4xx (a body that is not UTF-8 or nests too deep, unknown route, wrong method)
        # in the OpenAI shape rather than `{"detail": ...}`.
        message = "The request body is not valid JSON." if exc.status_code == 400 else str(exc.detail)
        error_type = "BadRequestError" if exc.status_code < 500 else "InternalServerError"
        body = error_body(message, error_type, code=exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        error = find_openai_error(exc)
        if error is None:
            logger.exception("unhandled error")
            error = OpenAIError(f"Internal error: {type(exc).__name__}")
        return render(error)

    # async: a plain `def` dependency would cost every request a hop to the thread pool.
    async def deadline_of(x_request_timeout: Annotated[str | None, Header()] = None) -> Deadline | None:
        return request_deadline(services.args.limits, x_request_timeout)

    # A default, not an Annotated alias: FastAPI resolves annotations in the module, not this function.
    with_deadline = Depends(deadline_of)

    @app.get("/health", responses={503: {"description": "A stage failed its last check (same body)."}})
    async def health() -> Response:
        ok, details = services.health.report()
        return JSONResponse({"status": "ok" if ok else "unhealthy", "stages": details},
                            status_code=200 if ok else 503)  # fmt: skip

    @app.get("/v1/models", response_model=ModelList, responses={401: {"model": ErrorResponse}})
    async def models() -> ModelList:
        cfg = services.args.model
        return ModelList(data=[ModelCard(id=cfg.name, root=cfg.path, max_model_len=cfg.max_model_len)])

    @app.get("/metrics", response_class=PlainTextResponse, responses={401: {"model": ErrorResponse}})
    async def metrics() -> Response:
        body = services.metrics.render()
        try:
            body += (await services.llm.metrics_text()).encode()
        except Exception as exc:  # the ingress's own metrics must still be served when the llm is down
            body += f"# llm stage metrics unavailable: {type(exc).__name__}\n".encode()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions", responses=_STREAMING)
    async def chat_completions(request: ChatCompletionRequest, deadline: Deadline | None = with_deadline) -> Any:
        return await create_chat_completion(services, request, deadline)

    @app.post("/v1/completions", responses=_STREAMING)
    async def completions(request: CompletionRequest, deadline: Deadline | None = with_deadline) -> Any:
        return await create_completion(services, request, deadline)

    @app.post("/v1/audio/speech", responses=_ERRORS, response_class=Response)
    async def speech(request: SpeechRequest, deadline: Deadline | None = with_deadline) -> Response:
        return await create_speech(services, request, deadline)

    @app.get("/v1/audio/voices", response_model=VoiceList, responses=_ERRORS)
    async def voices() -> VoiceList:
        return list_voices(services)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        return await tokenize_serving.tokenize(services, request)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        return await tokenize_serving.detokenize(services, request)

    return app
