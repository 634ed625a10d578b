"""Free ports for servers started later (`load/ports.py`): never from the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from load import ports


def ranged(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def test_a_free_port_lies_below_the_ephemeral_range(tmp_path: Path) -> None:
    path = ranged(tmp_path, "20000\t60999\n")
    found = {ports.free_port(path=path) for _ in range(20)}
    assert all(ports.LOWEST <= port < 20000 for port in found)


def test_a_taken_port_is_skipped(tmp_path: Path) -> None:
    path = ranged(tmp_path, f"{ports.LOWEST + 2} 60999")  # two candidates
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.LOWEST))
        assert {ports.free_port(path=path) for _ in range(10)} == {ports.LOWEST + 1}


def test_without_a_readable_range_linux_default_is_assumed(tmp_path: Path) -> None:
    assert ports.ephemeral_start(tmp_path / "missing") == 32768
    assert ports.ephemeral_start(ranged(tmp_path, "garbage")) == 32768


def test_no_free_port_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ranged(tmp_path, f"{ports.LOWEST + 1} 60999")  # one candidate, taken
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.LOWEST))
        with pytest.raises(RuntimeError, match="no free port"):
            ports.free_port(path=path)
