"""deployments/llm.py: the llm replica around `LLMStage`, with a fake engine instead of vLLM's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from vllm import envs
from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

from deployments.llm import LLM
from serve_app import token_channel
from serve_app.config import AppArgs
from serve_app.errors import EngineDeadError, ServiceUnavailableError, chunks_sent_before
from serve_app.stages.llm import LLMStage
from serve_app.token_channel import Inbox
from tests.unit.conftest import deployment_class
from tests.unit.vllm_support import FakeEngine, output, request


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


@pytest.fixture
def replica_of(monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeEngine], Any]:
    """An llm replica of the deployment's class around `engine`."""

    def replica_of(engine: FakeEngine) -> Any:
        monkeypatch.setattr(LLMStage, "parts", staticmethod(lambda args: (engine, None, None, None, 0.0)))
        return deployment_class(LLM)(object())

    return replica_of


@pytest.mark.usefixtures("uncached_envs")
async def test_generate_to_sends_the_chunks_to_the_inbox_and_answers_how_many(replica_of: Any) -> None:
    engine = FakeEngine([output((0, "a", [1])), output((0, "b", [2]), finished=True)])
    inbox = Inbox("127.0.0.1")
    to, arrivals = await inbox.open()
    replica = replica_of(engine)
    assert await replica.generate_to(request(), to) == 2
    chunks = [await asyncio.wait_for(arrivals.get(), 5) for _ in range(2)]
    assert [chunk.deltas[0].text for chunk in chunks] == ["a", "b"]
    assert chunks[1].finished and engine.exit == "finished"


@pytest.mark.usefixtures("uncached_envs")
async def test_a_generate_to_cancelled_between_chunks_aborts_the_request_in_the_engine(
    replica_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine([output((0, "a", [1])), output((0, "b", [2]))])
    waiting = asyncio.Event()

    async def reader_far_behind(self: Any) -> None:
        waiting.set()
        await asyncio.Event().wait()

    # Cancelled while it waits for the inbox, outside the engine's generator: only closing it aborts the request.
    monkeypatch.setattr(token_channel._Connection, "wait_for_reader", reader_far_behind)
    to, arrivals = await Inbox("127.0.0.1").open()
    call = asyncio.create_task(replica_of(engine).generate_to(request(), to))
    assert (await asyncio.wait_for(arrivals.get(), 5)).deltas[0].text == "a"
    await waiting.wait()
    call.cancel()  # what Serve does when the caller cancels the call
    with pytest.raises(asyncio.CancelledError):
        await call
    assert engine.exit == "closed"


@pytest.mark.usefixtures("uncached_envs")
@pytest.mark.parametrize(
    ("error", "raised_as"), [(VLLMEngineDeadError(), EngineDeadError), (TypeError("a bug"), TypeError)]
)
async def test_an_error_after_chunks_says_how_many_were_sent(
    replica_of: Any, error: Exception, raised_as: type[Exception]
) -> None:
    engine = FakeEngine([output((0, "a", [1]))], error=error)
    to, arrivals = await Inbox("127.0.0.1").open()
    with pytest.raises(raised_as) as raised:
        await replica_of(engine).generate_to(request(), to)
    assert chunks_sent_before(raised.value) == 1
    assert (await asyncio.wait_for(arrivals.get(), 5)).deltas[0].text == "a"


@pytest.mark.usefixtures("uncached_envs")
async def test_an_error_of_a_broken_connection_says_no_chunks_are_on_their_way(
    replica_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent_one = token_channel._Connection.send

    def send_then_break(self: Any, key: int, chunk: Any) -> None:
        sent_one(self, key, chunk)
        self.writer.close()  # as when the inbox ends the connection

    monkeypatch.setattr(token_channel._Connection, "send", send_then_break)
    engine = FakeEngine([output((0, "a", [1])), output((0, "b", [2]))])
    to, _ = await Inbox("127.0.0.1").open()
    with pytest.raises(ServiceUnavailableError, match="lost its connection") as raised:
        await replica_of(engine).generate_to(request(), to)
    assert raised.value.chunks_sent == 0
