"""OpenAI-shaped errors, raised by any stage and rendered by the ingress.

Stages raise these instead of returning error values so that a bad request stops the pipeline at the
stage that finds the problem; Ray re-raises them in the caller as instances of the same class.
"""

from __future__ import annotations

import time
from typing import Any


class OpenAIError(Exception):
    """An error the client should see as `{"error": {"message", "type", "param", "code"}}`."""

    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments are lost by the default pickling that Ray uses between replicas.
        return (_rebuild, (type(self), self.message, self.param, self.code))

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status_code,
            }
        }


def _rebuild(cls: type[OpenAIError], message: str, param: str | None, code: str | None) -> OpenAIError:
    return cls(message, param=param, code=code)


class BadRequestError(OpenAIError):
    status_code = 400
    error_type = "BadRequestError"


class AuthenticationError(OpenAIError):
    status_code = 401
    error_type = "AuthenticationError"


class NotFoundError(OpenAIError):
    status_code = 404
    error_type = "NotFoundError"


class ServiceUnavailableError(OpenAIError):
    status_code = 503
    error_type = "ServiceUnavailableError"


class EngineDeadError(ServiceUnavailableError):
    """The LLM engine has died or hung; the stage's replica must be restarted."""


class StageUnavailableError(ServiceUnavailableError):
    """A stage's replica died or became unreachable during a call; Serve replaces it, so a retry can succeed."""


def find_openai_error(exc: BaseException) -> OpenAIError | None:
    """The OpenAIError behind `exc`, looking through Ray's wrappers and exception chains."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OpenAIError):
            return current
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else current.__cause__
    return None


class OverloadedError(ServiceUnavailableError):
    """A request not admitted: `stage` is at its limit for `reason` (`stage_full`, `engine_queue_full`,
    `max_streams`, `ingress_full`, `expected_wait`). The ingress answers it with the `admission:` status
    and Retry-After, and counts it."""

    retry_after_s = 1

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
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # The reason is raised in a replica (engine queue) and counted in the ingress.
        return (_rebuild_overloaded, (type(self), self.message, self.param, self.code, self.stage, self.reason))


def _rebuild_overloaded(
    cls: type[OverloadedError], message: str, param: str | None, code: str | None, stage: str, reason: str
) -> OverloadedError:
    return cls(message, param=param, code=code, stage=stage, reason=reason)


class DeadlineExceededError(OpenAIError):
    """The request's deadline (`X-Request-Timeout` or `limits.request_timeout_s`) passed; every stage
    refuses work on it, and the ingress stops waiting."""

    status_code = 504
    error_type = "GatewayTimeoutError"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = "deadline_exceeded") -> None:
        super().__init__(message, param=param, code=code)

    @classmethod
    def check(cls, deadline: float | None, stage: str) -> None:
        """Refuse work whose deadline (wall-clock seconds, as in the messages) has passed."""
        if deadline is not None and time.time() >= deadline:
            raise cls(f"The request's deadline passed before the {stage} stage started on it.")


class PayloadTooLargeError(OpenAIError):
    status_code = 413
    error_type = "BadRequestError"


class RateLimitError(OpenAIError):
    """A client over its own share (`auth.max_concurrent_per_key`); it should retry after `retry_after_s`."""

    status_code = 429
    error_type = "RateLimitError"
    retry_after_s = 1
