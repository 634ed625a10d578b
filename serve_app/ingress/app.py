"""The ingress's HTTP API: thin routes over the endpoint modules, OpenAI-shaped errors, metrics.

`create_app` takes each model's stages as `Services` (one, or several in a `ModelRouter`: each
route picks the request's by its `model`), so the same app runs as the Ray Serve ingress
(`deployments/ingress.py`), in unit tests with in-process stages, and as a single-process baseline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.errors import (
    BadRequestError,
    OpenAIError,
    OverloadedError,
    error_body,
    error_response,
    error_type_of,
    find_openai_error,
)
from serve_app.ingress.chat.protocol import ChatCompletionRequest
from serve_app.ingress.chat.serving import create_chat_completion
from serve_app.ingress.completions.protocol import CompletionRequest
from serve_app.ingress.completions.serving import create_completion
from serve_app.ingress.middleware.admission import InFlightLimit
from serve_app.ingress.middleware.auth import ApiKeyAuth, load_keys
from serve_app.ingress.middleware.body_limit import BodySizeLimit
from serve_app.ingress.middleware.early_admission import EarlyAdmission
from serve_app.ingress.middleware.paths import KNOWN_PATHS, route_path
from serve_app.ingress.observability.metrics import IngressMetrics
from serve_app.ingress.pipeline.deadline import arrival, request_deadline, stamp_arrival
from serve_app.ingress.pipeline.router import Capability, ModelRouter, capabilities
from serve_app.ingress.pipeline.services import Services
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
from serve_app.messages import Deadline

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
    """Counts requests by endpoint and status, and those in flight (pure ASGI: streams stay intact). As
    the outermost of our middleware, it also stamps each request's arrival, which its deadline counts from."""

    def __init__(self, app: ASGIApp, metrics: IngressMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stamp_arrival(scope)
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


def create_app(graph: ModelRouter | Services) -> FastAPI:
    router = graph if isinstance(graph, ModelRouter) else ModelRouter([graph])

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        router.start()
        yield
        # uvicorn runs this on SIGTERM before it re-raises the signal: the last chance to stop an
        # in-process engine, whose child process would otherwise outlive us.
        await router.close()

    def render(error: OpenAIError, services: Services | None = None) -> JSONResponse:
        """A refusal is counted and answered as the model it was routed to says (the front door's before)."""
        if isinstance(error, OverloadedError):
            (services.metrics if services else router.metrics).rejections.labels(error.stage, error.reason).inc()
        return error_response(error, services.args.admission if services else router.admission)

    def routed(request: Request) -> Services | None:
        return router.lookup(getattr(request.state, "model", None))

    def pick(request: Request, model: str | None, capability: Capability | None = None) -> Services:
        """Step 0 of every model's route: its Services, remembered for the error handlers."""
        services = router.route(model, capability)
        request.state.model = services.args.model.name
        return services

    app = FastAPI(title="serve-graph", summary="OpenAI-compatible serving graph on Ray Serve", lifespan=lifespan)
    # Outermost last: metrics see every answer; a request without a valid key takes no admission slot;
    # early admission buffers bodies the size limit already bounds.
    app.add_middleware(EarlyAdmission, lookup=router.lookup, render=render)
    app.add_middleware(BodySizeLimit, max_bytes=router.max_request_bytes)
    app.add_middleware(InFlightLimit, limit=router.max_in_flight, render=render)
    auth = router.auth
    app.add_middleware(
        ApiKeyAuth, keys=load_keys(auth), max_concurrent_per_key=auth.max_concurrent_per_key, render=render
    )
    app.add_middleware(_RequestMetrics, metrics=router.metrics)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return render(exc, routed(request))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(BadRequestError(message, param=param))

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own 4xx (a body that is not UTF-8 or nests too deep, unknown route, wrong method)
        # in the OpenAI shape rather than `{"detail": ...}`.
        message = "The request body is not valid JSON." if exc.status_code == 400 else str(exc.detail)
        body = error_body(message, error_type_of(exc.status_code), code=exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        error = find_openai_error(exc)
        if error is None:
            logger.exception("unhandled error")
            error = OpenAIError(f"Internal error: {type(exc).__name__}")
        return render(error, routed(request))

    def deadline_of(http: Request, services: Services, header: str | None) -> Deadline | None:
        # Each model's own `limits:`; called in the route, once the body names the model (no dependency:
        # a plain `def` one would cost every request a hop to the thread pool).
        return request_deadline(services.args.limits, header, arrival(http.scope))

    @app.get("/health", responses={503: {"description": "A stage failed its last check (same body)."}})
    async def health() -> Response:
        ok, details = router.health_report()
        return JSONResponse({"status": "ok" if ok else "unhealthy", "stages": details},
                            status_code=200 if ok else 503)  # fmt: skip

    @app.get("/v1/models", response_model=ModelList, responses={401: {"model": ErrorResponse}})
    async def models() -> ModelList:
        cards = [
            ModelCard(id=name, root=s.args.model.path, max_model_len=s.args.model.max_model_len,
                      capabilities=list(capabilities(s)))
            for name, s in router.models.items()
        ]  # fmt: skip
        return ModelList(data=cards)

    @app.get("/metrics", response_class=PlainTextResponse, responses={401: {"model": ErrorResponse}})
    async def metrics() -> Response:
        body = await router.render_metrics()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions", responses=_STREAMING)
    async def chat_completions(
        http: Request, request: ChatCompletionRequest, x_request_timeout: Annotated[str | None, Header()] = None
    ) -> Any:
        services = pick(http, request.model)
        return await create_chat_completion(services, request, deadline_of(http, services, x_request_timeout))

    @app.post("/v1/completions", responses=_STREAMING)
    async def completions(
        http: Request, request: CompletionRequest, x_request_timeout: Annotated[str | None, Header()] = None
    ) -> Any:
        services = pick(http, request.model)
        return await create_completion(services, request, deadline_of(http, services, x_request_timeout))

    @app.post("/v1/audio/speech", responses=_ERRORS, response_class=Response)
    async def speech(
        http: Request, request: SpeechRequest, x_request_timeout: Annotated[str | None, Header()] = None
    ) -> Response:
        services = pick(http, request.model, "speech")
        return await create_speech(services, request, deadline_of(http, services, x_request_timeout))

    @app.get("/v1/audio/voices", response_model=VoiceList, responses=_ERRORS)
    async def voices(
        http: Request, model: Annotated[str | None, Query(description="A speech model; default: the only one.")] = None
    ) -> VoiceList:
        return list_voices(pick(http, model, "speech"))

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(http: Request, request: TokenizeRequest) -> TokenizeResponse:
        return await tokenize_serving.tokenize(pick(http, request.model), request)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(http: Request, request: DetokenizeRequest) -> DetokenizeResponse:
        return await tokenize_serving.detokenize(pick(http, request.model), request)

    return app
