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


@pytest.fixture
def lowest(monkeypatch: pytest.MonkeyPatch) -> int:
    """`ports.LOWEST` moved to a port that is free now with the next one free too: the machine's own
    servers may hold the real ones (`make serve`'s Ray client server listens on 10001)."""
    for base in range(20000, 21000, 2):
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", base))
                second.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        monkeypatch.setattr(ports, "LOWEST", base)
        return base
    raise AssertionError("no two free ports next to each other between 20000 and 21000")


def test_a_free_port_lies_below_the_ephemeral_range(tmp_path: Path) -> None:
    path = ranged(tmp_path, "20000\t60999\n")
    found = {ports.free_port(path=path) for _ in range(20)}
    assert all(ports.LOWEST <= port < 20000 for port in found)


def test_a_taken_port_is_skipped(tmp_path: Path, lowest: int) -> None:
    path = ranged(tmp_path, f"{lowest + 2} 60999")  # two candidates
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", lowest))
        assert {ports.free_port(path=path) for _ in range(10)} == {lowest + 1}


def test_without_a_readable_range_linux_default_is_assumed(tmp_path: Path) -> None:
    assert ports.ephemeral_start(tmp_path / "missing") == 32768
    assert ports.ephemeral_start(ranged(tmp_path, "garbage")) == 32768


def test_no_free_port_is_an_error(tmp_path: Path, lowest: int) -> None:
    path = ranged(tmp_path, f"{lowest + 1} 60999")  # one candidate, taken
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", lowest))
        with pytest.raises(RuntimeError, match="no free port"):
            ports.free_port(path=path)
