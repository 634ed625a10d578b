"""RMS normalization in a CPU engine by the C++ kernels of vLLM's CPU build, not by PyTorch op by op.

vLLM (0.32) runs its RMSNorm layers through IR ops (`vllm.ir.ops.rms_norm`, `fused_add_rms_norm`), each
call taking the first implementation of a priority list that accepts its arguments (KernelConfig's
`ir_op_priority`, `vllm serve --ir-op-priority`). On a CPU the list is `native` alone: a handful of
PyTorch ops, which Inductor fuses when it compiles the model. An eager engine (`enforce_eager: true`, as
every model of configs/cpu-tiny.yaml) runs them one by one: ~40-60 us a call for one, two or 32 rows of
256 on the AVX2-only kind, where the CPU build's own kernels (`torch.ops._C.rms_norm`,
`fused_add_rms_norm`; vLLM registers them as `vllm_c` for GPUs only) take ~5-8 us. The talker calls
them 9 times a decode step: in its engine's profile the norms fell from 11.2 % to 4.1 % of the step
(docs/benchmarks-notes.md, stop 65).

`install`, a vLLM general plugin (entry point `vllm.general_plugins`), registers those kernels on a CPU
platform as the implementation `PROVIDER`. As vLLM's IR asks, registering enables nothing: only an
engine whose priority lists it uses it. The llm stage lists it (`used`, `priority`) with
`engine.rms_norm: kernel` for an eager float32 engine on a CPU, once the plugin is loaded (without it, a
priority naming it would stop the engine from starting); a `vllm serve` in the same environment keeps
`native`. A compiled engine keeps `native` for Inductor to fuse (not measured with the kernels), and so
does an engine in bfloat16, where the kernel's residual sum rounded otherwise than `native`'s, by a unit
in the last place here and there.

vLLM appends `native` to the list, and it takes every call the kernels are not given (`supports`): a
strided input (the kernel reads it as contiguous, and gets it wrong), a row whose length is not a
multiple of 16 (the kernel refuses what its vectors do not divide), a weight of another length or dtype
or none, and a variance over part of the row. The kernels sum the squares in another order: a result
may differ from `native`'s in its last bit; the residual of `fused_add_rms_norm` is the same sum, bit
for bit.
"""

# No `from __future__ import annotations`: vLLM checks each implementation's signature against the
# native one's (torch's `infer_schema`), which needs the annotations as types.

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from serve_app.engine_config import RmsNorm

if TYPE_CHECKING:
    from vllm.config.kernel import IrOpPriorityConfig

PROVIDER = "serve_graph_cpu"
_OPS = ("rms_norm", "fused_add_rms_norm")

logger = logging.getLogger("vllm.serve_graph.rms_norm")


def used(method: RmsNorm, *, on_cpu: bool, eager: bool, dtype: str) -> RmsNorm:
    """What an engine configured with `method` runs: the kernels only where they were measured and are
    registered, else `native`."""
    if method != "kernel" or not (on_cpu and eager and dtype == "float32"):
        return "native"
    from vllm import ir
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # type: ignore[no-untyped-call]  # as vLLM's engine arguments do; once a process
    impl = ir.ops.rms_norm.impls.get(PROVIDER)
    if impl is None or not impl.supported:
        logger.warning("RMSNorm runs native: plugin serve_graph_rms_norm not loaded (VLLM_PLUGINS?) or no kernels")
        return "native"
    return "kernel"


def priority(method: RmsNorm) -> "IrOpPriorityConfig":
    """The engine's `ir_op_priority` for `method` (vLLM appends its platform's to each list)."""
    from vllm.config.kernel import IrOpPriorityConfig

    return IrOpPriorityConfig(**{op: [PROVIDER] for op in _OPS}) if method == "kernel" else IrOpPriorityConfig()


def supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    return (
        variance_size is None
        and x.dtype == torch.float32
        and x.shape[-1] % 16 == 0
        and x.is_contiguous()
        and weight is not None
        and weight.dtype == x.dtype
        and weight.shape == x.shape[-1:]
        and weight.is_contiguous()
    )


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, epsilon)
    return out


def supports_add(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    return (
        supports(x, weight, epsilon, variance_size)
        and x_residual.dtype == x.dtype
        and x_residual.shape == x.shape
        and x_residual.is_contiguous()
    )


def fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    # In place (registered so: vLLM hands it copies where the caller needs its inputs kept).
    torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
    return x, x_residual


def install() -> None:
    """vLLM general plugin: on a CPU platform, registers the kernels (as unsupported, which vLLM skips, where
    the build has none); the engine's priority decides whether they run."""
    from vllm import ir
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or PROVIDER in ir.ops.rms_norm.impls:
        return
    import vllm._custom_ops  # noqa: F401  (loads the build's `_C` ops)

    # Registered either way, so that a priority naming it never stops an engine from starting.
    supported = all(hasattr(torch.ops._C, op) for op in _OPS)
    ir.ops.rms_norm.register_impl(PROVIDER, supported=supported, supports_args=supports)(rms_norm)
    ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supported=supported, supports_args=supports_add, inplace=True)(
        fused_add_rms_norm
    )
