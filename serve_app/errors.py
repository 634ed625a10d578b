"""OpenAI-shaped errors, raised by any stage and rendered by the ingress.

Stages raise these instead of returning error values so that a bad request stops the pipeline at the
stage that finds the problem; Ray re-raises them in the caller as instances of the same class.
`error_body` and `error_response` are the one place the OpenAI error body and its HTTP answer are made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

from serve_app.config import AdmissionConfig

if TYPE_CHECKING:
    from serve_app.messages import Deadline


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: int | str | None = None
) -> dict[str, Any]:
    """The OpenAI error body, `{"error": {"message", "type", "param", "code"}}`: every error the
    server answers (HTTP status or stream event) is built here."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class OpenAIError(Exception):
    """An error the client should see as `{"error": {"message", "type", "param", "code"}}`."""

    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        # Raised by an llm replica after it sent this many chunks of the stream (`mark_chunks_sent`).
        self.chunks_sent = 0

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments are lost by the default pickling that Ray uses between replicas; the
        # attributes (a subclass's own, `chunks_sent`) are set again from the state.
        return (_rebuild, (type(self), self.message, self.param, self.code), self.__dict__)

    def to_dict(self) -> dict[str, Any]:
        code = self.code if self.code is not None else self.status_code
        return error_body(self.message, self.error_type, param=self.param, code=code)


def _rebuild(cls: type[OpenAIError], message: str, param: str | None, code: str | None) -> OpenAIError:
    return cls(message, param=param, code=code)


class BadRequestError(OpenAIError):
    status_code = 400
    error_type = "BadRequestError"

    @classmethod
    def context_length_exceeded(cls, max_model_len: int, tokens: str, param: str) -> BadRequestError:
        """A prompt of `tokens` ("300", "at least 300") input tokens that leaves no room in the context."""
        return cls(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{tokens} input tokens. Please reduce the length of the input.",
            param=param,
            code="context_length_exceeded",
        )

    @classmethod
    def no_speech(cls, model: str | None, param: str | None = "model") -> BadRequestError:
        """A speech request for a model without a `tts` block (`model` None: the one the stage serves)."""
        name = "This model" if model is None else f"The model `{model}`"
        return cls(f"{name} does not generate speech.", param=param, code="model_not_tts")

    @classmethod
    def budget_past_context(cls, max_tokens: int, max_model_len: int, param: str) -> BadRequestError:
        """A generation budget no prompt leaves room for (vLLM's words); one past the room a prompt leaves
        is cut to that room instead, as in vLLM 0.32."""
        return cls(
            f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param=param,
        )


class AuthenticationError(OpenAIError):
    status_code = 401
    error_type = "AuthenticationError"


class NotFoundError(OpenAIError):
    status_code = 404
    error_type = "NotFoundError"

    @classmethod
    def no_model(cls, name: str) -> NotFoundError:
        return cls(f"The model `{name}` does not exist.", param="model", code="model_not_found")


class ServiceUnavailableError(OpenAIError):
    status_code = 503
    error_type = "ServiceUnavailableError"


class EngineDeadError(ServiceUnavailableError):
    """The LLM engine has died or hung; the stage's replica must be restarted."""


class StageUnavailableError(ServiceUnavailableError):
    """A stage's replica died or became unreachable during a call; Serve replaces it, so a retry can succeed."""


def _behind(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it wraps: Ray's wrappers' `cause`, else the exception chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else current.__cause__


def find_openai_error(exc: BaseException) -> OpenAIError | None:
    """The OpenAIError behind `exc`, looking through Ray's wrappers and exception chains."""
    return next((error for error in _behind(exc) if isinstance(error, OpenAIError)), None)


def mark_chunks_sent(exc: BaseException, sent: int) -> None:
    """Says on `exc`, which an llm replica raises after sending `sent` chunks of a stream over the token
    channel, that they are on their way: the stream reads them before the error (`deployments/handles.py`).
    An attribute of the instance, which pickling keeps as its state; lost only with an exception class that
    pickles without its attributes (a `__reduce__` of its own), whose stream then ends at its error."""
    vars(exc)["chunks_sent"] = sent


def chunks_sent_before(exc: BaseException) -> int:
    """What `mark_chunks_sent` said on the first error behind `exc` that says it, 0 if none. Read from the
    instances' own attributes: Ray's wrapper of an error raised in a replica answers any attribute it lacks
    from the error."""
    return next((vars(error)["chunks_sent"] for error in _behind(exc) if "chunks_sent" in vars(error)), 0)


class OverloadedError(ServiceUnavailableError):
    """A request not admitted: `stage` is at its limit for `reason` (`stage_full`, `engine_queue_full`,
    `max_streams`, `ingress_full`, `expected_wait`). The ingress answers it with the `admission:` status
    and Retry-After, and counts it."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        stage: str = "ingress",
        reason: str = "stage_full",
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.stage = stage
        self.reason = reason  # raised in a replica (engine queue), counted in the ingress


class DeadlineExceededError(OpenAIError):
    """The request's deadline (`X-Request-Timeout` or `limits.request_timeout_s`) passed; every stage
    refuses work on it, and the ingress stops waiting."""

    status_code = 504
    error_type = "GatewayTimeoutError"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = "deadline_exceeded") -> None:
        super().__init__(message, param=param, code=code)

    @classmethod
    def check(cls, deadline: Deadline | None, stage: str) -> None:
        """Refuse work whose deadline has passed."""
        if deadline is not None and deadline.remaining() <= 0:
            raise cls(f"The request's deadline passed before the {stage} stage started on it.")


class PayloadTooLargeError(OpenAIError):
    status_code = 413
    error_type = "BadRequestError"


class RateLimitError(OpenAIError):
    """A client over its own share (`auth.max_concurrent_per_key`); answered 429 with Retry-After."""

    status_code = 429
    error_type = "RateLimitError"


def error_type_of(status_code: int) -> str:
    """The error `type` of an HTTP status that our code did not raise (FastAPI's own 4xx): that of the
    class above with this status, else BadRequestError (4xx) or InternalServerError."""
    for cls in (BadRequestError, AuthenticationError, NotFoundError, PayloadTooLargeError, RateLimitError,
                ServiceUnavailableError, DeadlineExceededError):  # fmt: skip
        if cls.status_code == status_code:
            return cls.error_type
    return BadRequestError.error_type if status_code < 500 else OpenAIError.error_type


def error_response(error: OpenAIError, admission: AdmissionConfig | None = None) -> JSONResponse:
    """`error` as an HTTP answer. A refusal carries `admission.retry_after_s` as Retry-After; a
    request not admitted (OverloadedError) also gets the `admission:` status."""
    admission = admission or AdmissionConfig()
    body = error.to_dict()
    if isinstance(error, RateLimitError):
        return JSONResponse(body, status_code=error.status_code, headers=_retry_after(admission))
    if not isinstance(error, OverloadedError):
        return JSONResponse(body, status_code=error.status_code)
    if admission.status_code == 429:
        body["error"]["type"] = "RateLimitError"
    return JSONResponse(body, status_code=admission.status_code, headers=_retry_after(admission))


def _retry_after(admission: AdmissionConfig) -> dict[str, str]:
    return {"Retry-After": str(admission.retry_after_s)}
