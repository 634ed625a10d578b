"""The ingress deployment's wiring (deployments/ingress.py), with recording handles instead of Serve's."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from deployments.ingress import FULL_COLLECTION_AFTER, Ingress
from serve_app.config import AppArgs
from serve_app.token_channel import Inbox
from tests.unit.conftest import deployment_class


class OptionsHandle:
    """Records the options it is asked for and gives a handle that records its own."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.given = options or {}

    def options(self, **options: Any) -> OptionsHandle:
        return OptionsHandle({**self.given, **options})


def test_every_stage_handle_uses_the_standard_pickle_both_ways(app_args: AppArgs) -> None:
    stages = {"tokenizer": OptionsHandle(), "llm": OptionsHandle()}
    ingress = deployment_class(Ingress)
    services = ingress._services(app_args, stages, Inbox("127.0.0.1"))
    for handle in [services.llm._handle, services.tokenizer._stage._handle]:
        assert handle.given["request_serialization"] == "pickle"
        assert handle.given["response_serialization"] == "pickle"


class ConstructorStopped(Exception):
    """Raised by the first Ray call in the ingress's constructor, so it runs without a cluster up to there."""


@pytest.fixture
def gc_thresholds() -> Iterator[tuple[int, int, int]]:
    """This process's collection thresholds, restored after the test."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_the_ingress_runs_full_collections_rarely_from_its_start(
    gc_thresholds: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def stop() -> str:
        raise ConstructorStopped

    young, middle, oldest = gc_thresholds
    assert oldest < FULL_COLLECTION_AFTER  # else this test could not tell
    monkeypatch.setattr(ray.util, "get_node_ip_address", stop)
    ingress = deployment_class(Ingress).__bases__[0]  # ours, under the wrapper `@serve.ingress` makes
    with pytest.raises(ConstructorStopped):
        ingress(None, {})
    assert gc.get_threshold() == (young, middle, FULL_COLLECTION_AFTER)
