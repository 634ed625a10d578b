"""deployments/stop.py: every application is deleted at once, and Serve shuts down only after the drains."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ray import serve
from ray.serve import context

from deployments.stop import stop_serve


class FakeServe:
    """The controller as stop_serve sees it: applications that take `drain_polls` status reads to go."""

    def __init__(self, apps: list[str], drain_polls: int) -> None:
        self.apps = apps
        self.drain_polls = drain_polls
        self.calls: list[str] = []

    def delete_apps(self, names: list[str], blocking: bool) -> None:
        self.calls.append(f"delete {names} blocking={blocking}")

    def status(self) -> Any:
        if self.calls and self.calls[-1].startswith("delete"):
            self.drain_polls -= 1
            if self.drain_polls < 0:
                self.apps = []
        return SimpleNamespace(applications={name: None for name in self.apps})

    def shutdown(self) -> None:
        self.calls.append(f"shutdown with {self.apps} left")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeServe:
    fake = FakeServe(["llm-app", "tts-app"], drain_polls=3)
    monkeypatch.setattr(context, "_get_global_client", lambda: fake)
    monkeypatch.setattr(serve, "status", fake.status)
    monkeypatch.setattr(serve, "shutdown", fake.shutdown)
    monkeypatch.setattr("deployments.stop.time.sleep", lambda s: None)
    return fake


def test_deletes_every_app_at_once_and_shuts_down_after_the_drain(fake: FakeServe) -> None:
    stop_serve()
    assert fake.calls == ["delete ['llm-app', 'tts-app'] blocking=False", "shutdown with [] left"]


def test_shuts_down_at_the_deadline_if_a_drain_never_ends(fake: FakeServe, caplog: pytest.LogCaptureFixture) -> None:
    fake.drain_polls = 10**9
    stop_serve(timeout_s=0.0)
    assert fake.calls[-1] == "shutdown with ['llm-app', 'tts-app'] left"
    assert "still draining after 0 s, shutting Serve down anyway: ['llm-app', 'tts-app']" in caplog.text
