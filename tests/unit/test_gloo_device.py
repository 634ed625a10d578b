"""One-rank gloo groups on one device (`serve_app/stages/gloo_device.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from importlib.metadata import entry_points
from typing import Any, ClassVar

import pytest

from serve_app.stages import gloo_device
from serve_app.stages.gloo_device import ENV, ENV_IFNAME, sharing_one_device

# vLLM's way into the engine: its general plugins, then the groups an engine of one rank makes (the
# world and twelve more), then a collective on each; prints the process's threads by name, then ends the
# groups.
ENGINE = """
import collections, json, os, socket
import torch, torch.distributed as dist
from vllm.plugins import load_general_plugins
load_general_plugins()
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
for group in [dist.new_group([0], backend="gloo") for _ in range(12)]:
    tensor = torch.ones(2)
    dist.all_reduce(tensor, group=group)
    assert tensor.tolist() == [1.0, 1.0]
    dist.barrier(group=group)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(json.dumps(collections.Counter(names)))
# As vLLM does at shutdown: gloo groups left to the interpreter's exit can abort it (SIGABRT, "terminate
# called without an active exception", pytorch/pytorch#179291; once in a CI run here, with the device shared).
dist.destroy_process_group()
"""


# Settings that change which gloo devices torch makes, or which plugins vLLM runs.
UNSET = {ENV, ENV_IFNAME, "GLOO_DEVICE_TRANSPORT", "TORCH_GLOO_LAZY_INIT", "VLLM_PLUGINS"}


def engine_threads(asked: bool) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET} | ({ENV: "1"} if asked else {})
    done = subprocess.run([sys.executable, "-c", ENGINE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    threads: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return threads


def test_vllm_finds_the_plugin() -> None:
    found = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "serve_app.stages.gloo_device:install" in found


@pytest.mark.parametrize(("asked", "loops"), [(True, 1), (False, 13)])
def test_an_engine_of_one_rank_has_one_gloo_loop_when_asked(asked: bool, loops: int) -> None:
    assert engine_threads(asked).get("gloo_tcp_loop") == loops


class FakeGloo:
    """torch's `ProcessGroupGloo` as the subclass calls it: what each group was made with."""

    made: ClassVar[list[tuple[Any, ...]]] = []

    class _Options:
        _devices: list[object]
        _timeout: timedelta

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        FakeGloo.made.append((args, kwargs))

    @staticmethod
    def create_default_device() -> object:
        return object()


@pytest.fixture()
def gloo() -> Any:
    FakeGloo.made = []
    return sharing_one_device(FakeGloo)


def test_groups_of_one_rank_share_the_first_ones_device(gloo: Any) -> None:
    gloo("store", 0, 1, timeout=timedelta(seconds=5))
    gloo("store", 0, 1, timedelta(seconds=7))
    (first, _), (second, _) = FakeGloo.made
    assert first[:3] == ("store", 0, 1)
    assert len(first[3]._devices) == 1 and first[3]._devices[0] is second[3]._devices[0]
    assert (first[3]._timeout, second[3]._timeout) == (timedelta(seconds=5), timedelta(seconds=7))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((0, 2), {"timeout": timedelta(seconds=5)}),  # two ranks: torch's own device
        ((0, 1, "options"), {}),  # the caller's own options
        ((0, 1), {"options": "options"}),
        ((0, 1), {}),  # torch's default timeout, torch's way
        ((0, 1), {"other": timedelta(seconds=5)}),  # what torch would refuse, torch refuses
    ],
)
def test_other_groups_are_made_as_torch_makes_them(gloo: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    gloo("store", *args, **kwargs)
    assert FakeGloo.made == [(("store", *args), kwargs)]


def test_a_device_per_interface_stays_with_torch(gloo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_IFNAME, "eth0,eth1")
    gloo("store", 0, 1, timeout=timedelta(seconds=5))
    assert FakeGloo.made == [(("store", 0, 1), {"timeout": timedelta(seconds=5)})]


@pytest.mark.parametrize(("asked", "wrapped"), [("1", True), (None, False)])
def test_the_plugin_wraps_torchs_class_once_and_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, asked: str | None, wrapped: bool
) -> None:
    from torch.distributed import distributed_c10d

    if asked is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, asked)
    monkeypatch.setattr(distributed_c10d, "ProcessGroupGloo", FakeGloo)
    gloo_device.install()
    gloo_device.install()
    installed: type = distributed_c10d.ProcessGroupGloo
    assert (installed is not FakeGloo) is wrapped
    assert installed.__mro__[1:2] == ((FakeGloo,) if wrapped else (object,))
