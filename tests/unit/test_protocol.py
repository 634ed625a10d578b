"""serve_app/ingress/protocol.py: `null` for a field with a default, in validation and in the schema."""

from __future__ import annotations

from serve_app.ingress.chat.protocol import ChatCompletionRequest
from serve_app.ingress.completions.protocol import CompletionRequest

HI = [{"role": "user", "content": "Hi"}]


def test_null_for_a_field_with_a_default_is_the_default() -> None:
    request = ChatCompletionRequest.model_validate({"messages": HI, "n": None, "add_generation_prompt": None})
    assert (request.n, request.add_generation_prompt) == (1, True)
    assert "n" not in request.model_fields_set  # as if left out: no limit names it
    # A field whose default is None keeps the null it was sent.
    assert ChatCompletionRequest.model_validate({"messages": HI, "temperature": None}).temperature is None


def test_the_schema_says_null_is_accepted_once() -> None:
    n = ChatCompletionRequest.model_json_schema()["properties"]["n"]
    assert n["anyOf"][-1] == {"type": "null"} and n["default"] == 1
    # Already nullable: not wrapped again.
    max_tokens = CompletionRequest.model_json_schema()["properties"]["max_tokens"]
    assert [option.get("type") for option in max_tokens["anyOf"]].count("null") == 1
