"""deployments/llm.py: the llm replica around `LLMStage`, with a fake engine instead of vLLM's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm import envs

from deployments.llm import LLM
from serve_app.config import AppArgs
from serve_app.stages.llm import LLMStage


class Engine:
    """Only what the replica calls outside a request: its destructor shuts the engine down."""

    shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture
def uncached_envs() -> Iterator[None]:
    envs.disable_envs_cache()
    yield
    envs.disable_envs_cache()  # other tests set vLLM's variables and expect them read


def test_the_replica_caches_vllms_environment_once_its_engine_runs(
    monkeypatch: pytest.MonkeyPatch, uncached_envs: None
) -> None:
    built: list[AppArgs] = []
    engine = Engine()

    def parts(args: AppArgs) -> tuple[Any, ...]:
        assert not envs._is_envs_cache_enabled()  # not before the engine has started with its environment
        built.append(args)
        return engine, None, None, None, 0.0

    monkeypatch.setattr(LLMStage, "parts", staticmethod(parts))
    args: Any = object()
    replica = LLM.func_or_class(args)
    assert built == [args]
    assert envs._is_envs_cache_enabled()
    del replica
    assert engine.shut_down
