from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points

import pytest
import torch
from vllm import ir

from serve_app.engine_config import RmsNorm
from serve_app.stages import rms_norm

HIDDEN = 256  # the tiny models'


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    rms_norm.install()
    rms_norm.install()  # vLLM may load plugins twice in one process: registered once


@pytest.fixture
def kernel_first() -> Iterator[None]:
    """Both ops dispatching as an engine asked for `kernel` (vLLM appends `native`), for this test only."""
    kernel = [rms_norm.PROVIDER, "native"]
    with ir.ops.rms_norm.set_priority(kernel), ir.ops.fused_add_rms_norm.set_priority(kernel):
        yield


def inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows)
    x, residual = (torch.randn(rows, HIDDEN, generator=generator) for _ in range(2))
    return x, residual, torch.randn(HIDDEN, generator=generator)


def test_vllm_finds_the_plugin() -> None:
    assert "serve_app.stages.rms_norm:install" in {e.value for e in entry_points(group="vllm.general_plugins")}


def test_only_kernel_asks_for_it() -> None:
    kernel, native = rms_norm.priority("kernel"), rms_norm.priority("native")
    assert kernel.rms_norm == kernel.fused_add_rms_norm == [rms_norm.PROVIDER]
    assert native.rms_norm == native.fused_add_rms_norm == []  # vLLM's platform default, `native`


def test_only_an_eager_float32_cpu_engine_runs_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def used(method: RmsNorm = "kernel", on_cpu: bool = True, eager: bool = True, dtype: str = "float32") -> str:
        return rms_norm.used(method, on_cpu=on_cpu, eager=eager, dtype=dtype)

    assert used() == "kernel"
    assert "kernel" not in {used("native"), used(on_cpu=False), used(eager=False), used(dtype="bfloat16")}
    # A build without the kernels: registered as unsupported, which vLLM would skip.
    monkeypatch.setattr(ir.ops.rms_norm.impls[rms_norm.PROVIDER], "supported", False)
    assert used() == "native"
    # Without the plugin a priority naming it would stop the engine from starting.
    monkeypatch.delitem(ir.ops.rms_norm.impls, rms_norm.PROVIDER)
    assert used() == "native"


@pytest.mark.parametrize("rows", [1, 2, 33])
def test_the_kernels_compute_what_native_does(kernel_first: None, rows: int) -> None:
    x, residual, weight = inputs(rows)
    native = ir.ops.rms_norm.impls["native"].impl_fn
    native_add = ir.ops.fused_add_rms_norm.impls["native"].impl_fn
    x3 = torch.randn(3, rows, HIDDEN)  # 3-D: every dimension but the last is rows to the kernel
    torch.testing.assert_close(ir.ops.rms_norm(x3, weight, 1e-6), native(x3, weight, 1e-6))
    assert ir.ops.rms_norm.dispatch(x, weight, 1e-6).provider == rms_norm.PROVIDER
    assert ir.ops.fused_add_rms_norm.dispatch(x, residual, weight, 1e-6).provider == rms_norm.PROVIDER
    # The squares summed in another order: a result may differ in its last bit.
    torch.testing.assert_close(ir.ops.rms_norm(x, weight, 1e-6), native(x, weight, 1e-6))
    kept = x.clone(), residual.clone()
    out, summed = ir.ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    expected_out, expected_sum = native_add(x, residual, weight, 1e-6)
    torch.testing.assert_close(out, expected_out)
    assert torch.equal(summed, expected_sum)  # one addition, rounded once: the same bits
    assert torch.equal(x, kept[0]) and torch.equal(residual, kept[1])  # called as a function: inputs kept


def test_as_an_eager_engine_calls_them_the_inputs_are_the_outputs(kernel_first: None) -> None:
    """vLLM's RMSNorm layer calls `maybe_inplace`, which an eager CPU engine runs unwrapped (no torch op)."""
    x, residual, weight = inputs(2)
    expected_out, expected_sum = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x, residual, weight, 1e-6)
    with ir.enable_torch_wrap(False):
        out, summed = ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, weight, 1e-6)
    assert out is x and summed is residual
    torch.testing.assert_close(out, expected_out)
    assert torch.equal(summed, expected_sum)


def test_what_the_kernels_cannot_take_goes_to_native(kernel_first: None) -> None:
    x, residual, weight = inputs(4)
    strided = torch.randn(4, 2 * HIDDEN)[:, :HIDDEN]  # the kernel would read it as contiguous
    bf16 = x.bfloat16(), residual.bfloat16(), weight.bfloat16()  # its residual sum rounds otherwise
    odd = torch.randn(4, 264), torch.randn(264)  # 16 does not divide the row (the kernel's vectors must)
    weights = torch.randn(2 * HIDDEN)[::2], weight[:128], weight.double()
    for args in [(strided, weight), (x, None), (bf16[0], bf16[2]), odd, *((x, w) for w in weights)]:
        assert ir.ops.rms_norm.dispatch(*args, 1e-6).provider == "native"
    assert ir.ops.rms_norm.dispatch(x, weight, 1e-6, 64).provider == "native"  # a variance over part of the row
    residuals = strided, residual.double(), residual[:2]
    for add_args in [(strided, residual, weight), bf16, *((x, r, weight) for r in residuals)]:
        assert ir.ops.fused_add_rms_norm.dispatch(*add_args, 1e-6).provider == "native"
    expected = ir.ops.rms_norm(strided.contiguous(), weight, 1e-6)
    torch.testing.assert_close(ir.ops.rms_norm(strided, weight, 1e-6), expected)
