"""deployments/llm.py: the llm replica around `LLMStage`, with a fake engine instead of vLLM's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm import envs

from deployments.llm import LLM
from serve_app.config import AppArgs
from serve_app.stages.llm import LLMStage
from tests.unit.conftest import deployment_class
from tests.unit.test_llm import FakeEngine


@pytest.fixture
def uncached_envs() -> Iterator[None]:
    envs.disable_envs_cache()
    yield
    envs.disable_envs_cache()  # other tests set vLLM's variables and expect them read


@pytest.mark.usefixtures("uncached_envs")
def test_the_replica_reads_vllms_environment_once_its_engine_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine starts with the environment as it is then; from there on vLLM's variables are cached
    (a later change is not seen). The replica's destructor still shuts the engine down."""
    monkeypatch.setenv("VLLM_COMPUTE_NANS_IN_LOGITS", "0")
    built: list[AppArgs] = []
    engine = FakeEngine([])

    def parts(args: AppArgs) -> tuple[Any, ...]:
        monkeypatch.setenv("VLLM_COMPUTE_NANS_IN_LOGITS", "1")  # as the replica sets OpenMP's before starting it
        assert envs.VLLM_COMPUTE_NANS_IN_LOGITS  # read as it is while the engine is built
        built.append(args)
        return engine, None, None, None, 0.0

    monkeypatch.setattr(LLMStage, "parts", staticmethod(parts))
    args: Any = object()
    llm = deployment_class(LLM)
    replica = llm(args)
    assert built == [args]
    monkeypatch.setenv("VLLM_COMPUTE_NANS_IN_LOGITS", "0")
    assert envs.VLLM_COMPUTE_NANS_IN_LOGITS  # cached: the output handler no longer reads os.environ
    del replica
    assert engine.shut_down
