"""vLLM's engine made without closing the log handlers the process already has.

vLLM configures its logging while an engine is made (`vllm.logger.configure_logging_if_needed`, called
by `AsyncEngineArgs.create_engine_config` and by `AsyncLLM`) with `logging.config.dictConfig`, and a
non-incremental dictConfig closes every handler of the process, not only those it replaces. In a Serve
replica that includes Serve's own: a `MemoryHandler` that buffers the replica's log records (access logs
among them; `RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE`, 1,000 in throughput mode) and writes them to the
replica's log file when the buffer is full. Closing it drops its target, and it stays on Serve's logger:
from then on it keeps every record and writes none. In the llm replica of `make serve`, after ~30,000
requests, it held 33,000 records, the replica's log file had no line since the engine started, and the
replica had grown by 82 MB (docs/benchmarks-notes.md, stop47): 2-3 KB of memory a request, in every llm
replica, for as long as it ran.

`log_handlers_kept` (a context manager, or a decorator) gives each memory handler that had a target
before the block its target back. A closed file handler reopens its file on its next record by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import MemoryHandler


def _memory_handlers() -> list[MemoryHandler]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [
        handler
        for logger in loggers
        if isinstance(logger, logging.Logger)  # the dict also holds placeholders for loggers not yet made
        for handler in logger.handlers
        if isinstance(handler, MemoryHandler)
    ]


@contextmanager
def log_handlers_kept() -> Iterator[None]:
    """Around making vLLM's engine: the memory handlers the block closes get their targets back."""
    targets = {handler: handler.target for handler in _memory_handlers() if handler.target is not None}
    try:
        yield
    finally:
        for handler, target in targets.items():
            if handler.target is None:
                handler.setTarget(target)
