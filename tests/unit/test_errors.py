"""serve_app/errors.py: the OpenAI error shape, pickling across Ray, and finding errors in chains."""

from __future__ import annotations

import json
import pickle

import pytest
from ray.exceptions import RayTaskError

from serve_app.config import AdmissionConfig
from serve_app.errors import (
    AuthenticationError,
    BadRequestError,
    EngineDeadError,
    NotFoundError,
    OpenAIError,
    OverloadedError,
    PayloadTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
    StageUnavailableError,
    chunks_sent_before,
    error_response,
    error_type_of,
    find_openai_error,
    mark_chunks_sent,
)

ALL = [OpenAIError, BadRequestError, NotFoundError, ServiceUnavailableError, EngineDeadError, OverloadedError]


class Wrapper(Exception):
    """Like Ray's RayTaskError: the original exception is in `.cause`, not in `__cause__`."""

    def __init__(self, cause: object) -> None:
        super().__init__("wrapped")
        self.cause = cause


@pytest.mark.parametrize(
    ("cls", "status", "error_type"),
    [
        (OpenAIError, 500, "InternalServerError"),
        (BadRequestError, 400, "BadRequestError"),
        (NotFoundError, 404, "NotFoundError"),
        (ServiceUnavailableError, 503, "ServiceUnavailableError"),
        (EngineDeadError, 503, "ServiceUnavailableError"),
        (OverloadedError, 503, "ServiceUnavailableError"),
    ],
)
def test_to_dict_without_code_uses_the_status(cls: type[OpenAIError], status: int, error_type: str) -> None:
    error = cls("something went wrong")
    assert error.status_code == status
    assert error.to_dict() == {
        "error": {"message": "something went wrong", "type": error_type, "param": None, "code": status}
    }


def test_to_dict_with_param_and_code() -> None:
    error = BadRequestError("too long", param="messages", code="context_length_exceeded")
    assert error.to_dict() == {
        "error": {
            "message": "too long",
            "type": "BadRequestError",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    assert str(error) == "too long"


def test_hierarchy() -> None:
    assert issubclass(EngineDeadError, ServiceUnavailableError)
    assert issubclass(OverloadedError, ServiceUnavailableError)


@pytest.mark.parametrize("error", [BadRequestError("bad", param="n"), AuthenticationError("who?"),
                                   PayloadTooLargeError("big"), EngineDeadError("dead")])  # fmt: skip
def test_an_error_response_is_its_status_and_body(error: OpenAIError) -> None:
    response = error_response(error, AdmissionConfig(status_code=429, retry_after_s=7))
    assert (response.status_code, json.loads(bytes(response.body))) == (error.status_code, error.to_dict())
    assert "retry-after" not in response.headers


def test_refusals_carry_the_configured_retry_after() -> None:
    admission = AdmissionConfig(status_code=429, retry_after_s=7)
    # Not admitted: the `admission:` status, typed to match it.
    response = error_response(OverloadedError("full", code="overloaded"), admission)
    assert (response.status_code, response.headers["retry-after"]) == (429, "7")
    assert json.loads(bytes(response.body))["error"] == {"message": "full", "type": "RateLimitError", "param": None,
                                                         "code": "overloaded"}  # fmt: skip
    # A key over its own limit: always 429, with the same Retry-After.
    response = error_response(RateLimitError("busy"), AdmissionConfig(retry_after_s=7))
    assert (response.status_code, response.headers["retry-after"]) == (429, "7")
    assert json.loads(bytes(response.body))["error"]["type"] == "RateLimitError"
    # The defaults: 503 and one second.
    response = error_response(OverloadedError("full"))
    assert (response.status_code, response.headers["retry-after"]) == (503, "1")


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip_keeps_class_and_fields(cls: type[OpenAIError], protocol: int) -> None:
    error = cls("bad thing", param="top_p", code="invalid_value")
    copy = pickle.loads(pickle.dumps(error, protocol=protocol))
    assert type(copy) is cls
    assert (copy.message, copy.param, copy.code) == ("bad thing", "top_p", "invalid_value")
    assert str(copy) == "bad thing"
    assert copy.to_dict() == error.to_dict()


def test_pickle_round_trip_without_param_or_code() -> None:
    copy = pickle.loads(pickle.dumps(NotFoundError("gone")))
    assert (type(copy), copy.message, copy.param, copy.code) == (NotFoundError, "gone", None, None)


def test_pickle_round_trip_keeps_the_attributes_set_on_an_error() -> None:
    error = OverloadedError("full", stage="llm", reason="engine_queue_full")
    mark_chunks_sent(error, 3)  # as an llm replica does on an error after chunks
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.stage, copy.reason, copy.chunks_sent) == ("llm", "engine_queue_full", 3)
    assert pickle.loads(pickle.dumps(EngineDeadError("x"))).chunks_sent == 0


def raised_in_a_replica(error: BaseException) -> BaseException:
    """`error` as a replica's caller gets it: pickled, inside Ray's wrapper."""
    return RayTaskError("generate_to", "Traceback ...", pickle.loads(pickle.dumps(error))).as_instanceof_cause()  # type: ignore[no-untyped-call, no-any-return]


def test_the_attributes_of_an_error_raised_in_a_replica_are_read_through_rays_wrapper() -> None:
    error = EngineDeadError("The engine died: x")
    mark_chunks_sent(error, 3)
    found = find_openai_error(raised_in_a_replica(error))
    assert isinstance(found, EngineDeadError)
    assert (found.chunks_sent, found.message) == (3, "The engine died: x")


@pytest.mark.parametrize("error", [EngineDeadError("The engine died: x"), RuntimeError("a bug")])
def test_the_chunks_sent_before_any_error_raised_in_a_replica_are_read(error: Exception) -> None:
    assert chunks_sent_before(raised_in_a_replica(error)) == 0
    mark_chunks_sent(error, 3)
    assert chunks_sent_before(raised_in_a_replica(error)) == 3
    assert chunks_sent_before(StageUnavailableError("x")) == 0


def test_the_count_is_the_first_errors_that_says_one() -> None:
    earlier = RuntimeError("raised by an earlier call")
    mark_chunks_sent(earlier, 3)
    error = EngineDeadError("x")  # says 0 itself
    error.__cause__ = earlier
    assert chunks_sent_before(error) == 0


def test_find_returns_the_error_itself() -> None:
    error = BadRequestError("x")
    assert find_openai_error(error) is error


def test_find_through_cause_chain() -> None:
    error = NotFoundError("no model")
    try:
        try:
            try:
                raise error
            except NotFoundError as exc:
                raise KeyError("lookup") from exc
        except KeyError as exc:
            raise RuntimeError("outer") from exc
    except RuntimeError as outer:
        assert find_openai_error(outer) is error


def test_find_through_cause_attribute() -> None:
    error = OverloadedError("busy")
    assert find_openai_error(Wrapper(error)) is error
    # `.cause` first, then the cause's own `__cause__` chain.
    inner = RuntimeError("inner")
    inner.__cause__ = error
    assert find_openai_error(Wrapper(inner)) is error
    assert find_openai_error(Wrapper(Wrapper(error))) is error


def test_find_ignores_non_exception_cause_attribute() -> None:
    error = BadRequestError("x")
    wrapper = Wrapper("not an exception")
    wrapper.__cause__ = error
    assert find_openai_error(wrapper) is error


def test_find_returns_none_without_openai_error() -> None:
    assert find_openai_error(RuntimeError("plain")) is None
    assert find_openai_error(Wrapper(ValueError("x"))) is None


def test_find_stops_on_cycles() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert find_openai_error(a) is None
    wrapper = Wrapper(None)
    wrapper.cause = wrapper
    assert find_openai_error(wrapper) is None


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "BadRequestError"), (401, "AuthenticationError"), (404, "NotFoundError"), (405, "BadRequestError"),
     (413, "BadRequestError"), (429, "RateLimitError"), (503, "ServiceUnavailableError"),
     (504, "GatewayTimeoutError"), (500, "InternalServerError"), (502, "InternalServerError")],
)  # fmt: skip
def test_a_status_we_did_not_raise_gets_the_type_of_our_error_of_that_status(status: int, error_type: str) -> None:
    assert error_type_of(status) == error_type
