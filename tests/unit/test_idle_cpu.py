"""CPU of servers at rest by role (load/idle_cpu.py), from hand-made process tables."""

from __future__ import annotations

from load import idle_cpu
from load.bench import cpu


def test_shares_are_cpu_over_wall_time_and_sum_outside_the_engine() -> None:
    cell = cpu.CellCpu(
        wall_s=10.0,
        roles={
            "engine": cpu.RoleCpu(0.2, 1),
            "openai:ingress": cpu.RoleCpu(0.4, 1),
            "controller": cpu.RoleCpu(0.1, 1),
        },
    )
    result = idle_cpu.shares(cell)
    assert list(result["roles"]) == ["openai:ingress", "engine", "controller"]  # most first
    assert result["roles"]["openai:ingress"] == {"processes": 1, "core_share": 0.04}
    assert result["outside_engine_core_share"] == 0.05
    assert abs(result["total_core_share"] - 0.07) < 1e-12


def test_markdown_has_a_row_per_role_and_the_totals() -> None:
    cell = cpu.CellCpu(wall_s=2.0, roles={"engine": cpu.RoleCpu(0.1, 2), "api_server": cpu.RoleCpu(0.02, 1)})
    text = idle_cpu.markdown({"vllm": idle_cpu.shares(cell)})
    assert "| vllm | engine | 2 | 0.0500 |" in text
    assert "| vllm | **outside engine** | | **0.010** |" in text
    assert "| vllm | **all** | | **0.060** |" in text
