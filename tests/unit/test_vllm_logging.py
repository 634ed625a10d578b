"""`log_handlers_kept` against a logging configuration that closes every handler of the process, as
vLLM's does (`logging.config.dictConfig`); vLLM's own, inside `build_engine`: test_llm_build_engine.py."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Iterator
from logging.handlers import MemoryHandler, RotatingFileHandler
from pathlib import Path

import pytest

from serve_app.stages.vllm_logging import log_handlers_kept

# What a dictConfig of vLLM's kind does to the handlers it does not name: closes them.
CONFIGURE = {"version": 1, "disable_existing_loggers": False}
ReplicaLog = tuple[logging.Logger, MemoryHandler, Path]


@pytest.fixture
def replica_log(tmp_path: Path) -> Iterator[ReplicaLog]:
    """Serve's replica logging in small: records buffered by a memory handler, written to a file."""
    path = tmp_path / "replica.log"
    target = RotatingFileHandler(path, maxBytes=1 << 20)
    buffer = MemoryHandler(capacity=1, target=target)
    logger = logging.getLogger("tests.replica")
    logger.addHandler(buffer)
    logger.propagate = False
    yield logger, buffer, path
    logger.removeHandler(buffer)
    target.close()


def test_records_reach_the_file_after_a_configuration_inside(replica_log: ReplicaLog) -> None:
    logger, buffer, path = replica_log
    with log_handlers_kept():
        logging.config.dictConfig(CONFIGURE)
    logger.warning("after the configuration")
    assert buffer.target is not None
    assert "after the configuration" in path.read_text()  # the closed file handler opened its file again


def test_without_it_the_buffer_keeps_its_records(replica_log: ReplicaLog) -> None:
    logger, buffer, path = replica_log
    logging.config.dictConfig(CONFIGURE)
    logger.warning("after the configuration")
    assert buffer.target is None and len(buffer.buffer) == 1
    assert path.read_text() == ""
