"""Property-based fuzzing of the HTTP API from its own OpenAPI schema (schemathesis + hypothesis).

Every operation of the in-process text app (real tokenizer stage, fake engine) gets schema-valid and
schema-violating requests: no answer may be a 5xx, invalid data must be refused with a 4xx, and every
status, content type and body must be what the schema declares (errors: the OpenAI error model). The
number of examples is bounded so that the module stays under a minute; the request count is reported
at the end of the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from serve_app.ingress.app import create_app
from serve_app.ingress.pipeline.services import Services

EXAMPLES_PER_OPERATION = 100
CHECKS = [
    not_a_server_error,
    negative_data_rejection,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Not checked: `positive_data_acceptance` (schema-valid requests the server rightly refuses: a prompt over
# the context, an unknown model name, `n` above `limits.max_n`) and the stateful/auth checks (no resources
# are created; auth has its own tests).

_requests: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_request_count(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    summary = ", ".join(f"{op} {n}" for op, n in sorted(_requests.items()))
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    assert capture is not None  # pytest's own, always registered
    with capture.global_and_fixture_disabled():  # shown on a passing run too
        print(f"\nschemathesis: {sum(_requests.values())} requests ({summary})")


@pytest.fixture
def api_schema(services: Services) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(services))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_answers_every_request_as_its_schema_says(api_schema: Any, mode: GenerationMode) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # the GET routes take no input that could violate the schema

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
        def answers_as_declared(case: Any) -> None:
            response = case.call()
            _requests[f"{mode.value} {case.method} {case.path}"] += 1
            case.validate_response(response, checks=CHECKS)

        answers_as_declared()
