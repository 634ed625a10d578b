"""deployments/handles.py: a stage replica lost mid-call becomes a 503 naming the stage, and is reported."""

from __future__ import annotations

from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.serve.exceptions import BackPressureError

from deployments.handles import HandleTokenizer, HandleVocoder
from serve_app.errors import OverloadedError, StageUnavailableError
from serve_app.messages import TextPrompt, TokenizeRequest


class FailingHandle:
    """A DeploymentHandle whose every method call raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, method: str) -> Any:
        return self

    async def _raise(self) -> None:
        raise self.error

    def remote(self, *args: Any) -> Any:
        return self._raise()


@pytest.mark.parametrize("error", [ActorDiedError(), ActorUnavailableError("Actor is unavailable.", None)])
async def test_a_lost_replica_is_a_503_naming_the_stage_and_is_reported(error: BaseException) -> None:
    lost: list[tuple[str, str]] = []
    tokenizer = HandleTokenizer(FailingHandle(error), lambda stage, detail: lost.append((stage, detail)))  # type: ignore[arg-type]
    with pytest.raises(StageUnavailableError) as raised:
        await tokenizer.tokenize(TokenizeRequest(TextPrompt("hi"), add_special_tokens=True))
    assert raised.value.status_code == 503
    assert raised.value.code == "stage_unavailable"
    assert "The tokenizer stage failed during the request" in raised.value.message
    assert raised.value.__cause__ is error
    assert lost == [("tokenizer", f"replica lost mid-call: {type(error).__name__}")]


async def test_backpressure_is_not_a_lost_replica() -> None:
    lost: list[tuple[str, str]] = []
    vocoder = HandleVocoder(FailingHandle(BackPressureError(num_queued_requests=1, max_queued_requests=1)),  # type: ignore[arg-type]
                            lambda stage, detail: lost.append((stage, detail)))  # fmt: skip
    with pytest.raises(OverloadedError):
        await vocoder.check_health()
    assert lost == []


async def test_other_errors_pass_through() -> None:
    tokenizer = HandleTokenizer(FailingHandle(KeyError("x")))  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        await tokenizer.detokenize([1])
