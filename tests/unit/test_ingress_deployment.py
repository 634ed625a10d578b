"""The ingress deployment's wiring (deployments/ingress.py), with recording handles instead of Serve's."""

from __future__ import annotations

import gc
from typing import Any

from deployments.ingress import FULL_COLLECTION_AFTER, Ingress, collect_rarely
from serve_app.config import AppArgs
from serve_app.token_channel import Inbox
from tests.unit.conftest import deployment_class


class RecordingHandle:
    """Records the options it is asked for and gives a handle that records its own."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.given = options or {}

    def options(self, **options: Any) -> RecordingHandle:
        return RecordingHandle({**self.given, **options})


def test_every_stage_handle_uses_the_standard_pickle_both_ways(app_args: AppArgs) -> None:
    stages = {"tokenizer": RecordingHandle(), "llm": RecordingHandle()}
    ingress = deployment_class(Ingress)
    services = ingress._services(app_args, stages, Inbox("127.0.0.1"))
    for handle in [services.llm._handle, services.tokenizer._stage._handle]:
        assert handle.given["request_serialization"] == "pickle"
        assert handle.given["response_serialization"] == "pickle"


def test_the_ingress_runs_full_collections_rarely_and_leaves_the_younger_generations_alone() -> None:
    before = gc.get_threshold()
    try:
        collect_rarely()
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_AFTER)
        assert before[2] < FULL_COLLECTION_AFTER
    finally:
        gc.set_threshold(*before)
