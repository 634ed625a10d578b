"""Step 1 of the request path (`generation.py`): the request checked against its model's config."""

from __future__ import annotations

from serve_app.errors import BadRequestError, NotFoundError
from serve_app.ingress.pipeline.services import Services
from serve_app.ingress.protocol import SamplingRequest


def check_model(services: Services, requested: str | None) -> str:
    """The model's name. The router already answered a name it does not serve; this checks a request that
    reaches a serving function in-process, without the router."""
    name = services.args.model.name
    if requested and requested != name:
        raise NotFoundError.no_model(requested)
    return name


def check_limits(services: Services, request: SamplingRequest, logprobs: int | None) -> None:
    limits = services.args.limits
    if request.n > limits.max_n:
        raise BadRequestError(f"n must be at most {limits.max_n}, got {request.n}.", param="n")
    if logprobs is not None and logprobs > limits.max_logprobs:
        raise BadRequestError(f"logprobs must be at most {limits.max_logprobs}, got {logprobs}.", param="logprobs")
    if request.max_tokens is None or "max_tokens" not in request.model_fields_set:
        return  # a route's default budget is cut to `limits.max_tokens` (`generation.start_stream`), not refused
    max_model_len = services.args.model.max_model_len
    if request.max_tokens > max_model_len:  # before any tokenizing, as vLLM
        raise BadRequestError.budget_past_context(request.max_tokens, max_model_len, request.budget_param)
    if limits.max_tokens is not None and request.max_tokens > limits.max_tokens:
        raise BadRequestError(
            f"{request.budget_param} must be at most {limits.max_tokens}, got {request.max_tokens}.",
            param=request.budget_param,
        )
