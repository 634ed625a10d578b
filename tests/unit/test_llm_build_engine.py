"""`build_engine` in serve_app/stages/llm.py: the engine arguments and the environment its engine core
starts with, its socket files (vLLM's `AsyncLLM.from_vllm_config` replaced, so no engine process starts)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from logging.handlers import MemoryHandler, RotatingFileHandler
from pathlib import Path
from typing import Any, cast

import pytest

from serve_app.stages import engine_session, penalties, rms_norm, top_p


class Made:
    """What the stand-in for `AsyncLLM.from_vllm_config` makes: an engine that records its shutdown."""

    def __init__(self, address: str = "") -> None:
        self.address = address
        self.shut_down: list[float | None] = []

    def shutdown(self, timeout: float | None = None) -> None:
        self.shut_down.append(timeout)


OMP_BINDING = ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "OMP_PLACES")  # the thread count, and GNU or standard binding


@pytest.fixture(autouse=True)
def engine_requests(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The variables `build_engine` writes for the engine core's plugins, set so that monkeypatch restores
    them after each test; the directory for the engine's socket files made in one of the test's own
    (short: a socket's path has at most 107 characters), removed after it."""
    for name in (top_p.ENV, penalties.ENV, engine_session.ENV):
        monkeypatch.setenv(name, "")
    # pytest places every test's tmp_path under a directory it makes in the temp dir on first use: made
    # now, before the temp dir is this test's own (removed after it, and with it a later test's tmp_path).
    tmp_path_factory.getbasetemp()
    own = tempfile.mkdtemp()
    monkeypatch.setattr(tempfile, "tempdir", own)
    yield
    shutil.rmtree(own)


@pytest.mark.parametrize("backend", ["uni", "mp"])
def test_the_engine_core_starts_with_the_omp_environment_of_its_executor(
    monkeypatch: pytest.MonkeyPatch, raw_args: dict[str, Any], backend: str
) -> None:
    """`uni`: the engine core process (started inside `AsyncLLM.from_vllm_config`) gets the OpenMP environment
    vLLM would give its worker, one thread bound to the engine's core; `mp`: vLLM's own worker gets it."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from serve_app.config import parse_app_args
    from serve_app.stages.llm import build_engine

    for name in OMP_BINDING:
        monkeypatch.delenv(name, raising=False)
    started: dict[str, Any] = {}

    made = Made()

    def start(vllm_config: Any, **_: Any) -> Made:
        started["executor"] = vllm_config.parallel_config.distributed_executor_backend
        started["env"] = {name: os.environ[name] for name in OMP_BINDING if name in os.environ}
        started["top_p"] = os.environ[top_p.ENV]
        started["penalties"] = os.environ[penalties.ENV]
        priority = vllm_config.kernel_config.ir_op_priority
        started["rms_norm"] = (priority.rms_norm, priority.fused_add_rms_norm)
        started["policy"] = vllm_config.scheduler_config.policy
        return made

    monkeypatch.setattr(AsyncLLM, "from_vllm_config", start)
    engine = {"cpu_cores": "1", "executor_backend": backend, "scheduling_policy": "priority", "dtype": "float32",
              "enforce_eager": True}  # fmt: skip
    built = build_engine(parse_app_args({**raw_args, "engine": engine}))
    assert cast(object, built) is made  # what the stand-in `start` returned, not an `Engine`
    assert started["executor"] == backend
    assert started["policy"] == "priority"  # vLLM's own engine would otherwise ignore every priority
    assert started["top_p"] == "histogram"  # the default; the engine's plugin reads it (tests/unit/test_top_p.py)
    assert started["penalties"] == "sparse"  # likewise (tests/unit/test_penalties.py)
    kernels_first = [rms_norm.PROVIDER, "native"]  # an eager float32 engine's (tests/unit/test_rms_norm.py)
    assert started["rms_norm"] == (kernels_first, kernels_first)
    if backend == "uni":  # libgomp (vLLM preloads it) is bound with GOMP_CPU_AFFINITY, other OpenMPs with OMP_PLACES
        assert started["env"] in ({"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "1"},
                                  {"OMP_NUM_THREADS": "1", "OMP_PLACES": "{1}"})  # fmt: skip
    else:
        assert started["env"] == {}
    assert not any(name in os.environ for name in OMP_BINDING)  # the replica's own environment is given back


def test_the_replicas_log_records_still_reach_its_file_once_the_engine_is_made(
    monkeypatch: pytest.MonkeyPatch, raw_args: dict[str, Any], tmp_path: Path
) -> None:
    """vLLM configures its logging while the engine is made, which closes every handler of the process,
    Serve's buffer of the replica's records among them (serve_app/stages/vllm_logging.py)."""
    import vllm.logger
    from vllm.v1.engine.async_llm import AsyncLLM

    from serve_app.config import parse_app_args
    from serve_app.stages.llm import build_engine

    # vLLM configures its logging once per process: again here, as in a replica that has not made an engine.
    monkeypatch.setattr(vllm.logger, "_last_configured_logging_config", None)
    monkeypatch.setattr(AsyncLLM, "from_vllm_config", lambda *_, **__: Made())
    path = tmp_path / "replica.log"
    target = RotatingFileHandler(path, maxBytes=1 << 20)
    serve_logger = logging.getLogger("ray.serve")
    monkeypatch.setattr(serve_logger, "handlers", [MemoryHandler(capacity=1, target=target)])
    monkeypatch.setattr(serve_logger, "propagate", False)
    try:
        build_engine(parse_app_args(raw_args))
        serve_logger.warning("once the engine is made")
    finally:
        target.close()
    assert "once the engine is made" in path.read_text()


def test_the_engines_socket_files_go_in_a_directory_of_its_own_removed_at_its_shutdown(
    monkeypatch: pytest.MonkeyPatch, raw_args: dict[str, Any]
) -> None:
    """vLLM names its sockets to the engine core in `VLLM_RPC_BASE_PATH` and, stopped, leaves the files."""
    import zmq
    from vllm import envs
    from vllm.utils.network_utils import get_open_zmq_ipc_path
    from vllm.v1.engine.async_llm import AsyncLLM

    from serve_app.config import parse_app_args
    from serve_app.stages.llm import build_engine

    envs.disable_envs_cache()  # read as in a replica whose engine has not started
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/elsewhere")

    def start(*_: Any, **__: Any) -> Made:
        address = get_open_zmq_ipc_path()  # as vLLM names each socket while the engine starts
        with zmq.Context() as context, context.socket(zmq.PULL) as pull:
            pull.bind(address)
        return Made(address)

    monkeypatch.setattr(AsyncLLM, "from_vllm_config", start)
    engine: Any = build_engine(parse_app_args(raw_args))
    socket_file = Path(engine.address.removeprefix("ipc://"))
    assert socket_file.exists() and socket_file.parent != Path("/elsewhere")
    assert os.environ["VLLM_RPC_BASE_PATH"] == "/elsewhere"  # the replica's own environment given back
    engine.shutdown(timeout=5.0)
    assert engine.shut_down == [5.0]  # vLLM's own shutdown, as asked, then
    assert not socket_file.parent.exists()
