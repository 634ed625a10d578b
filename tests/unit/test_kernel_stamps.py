"""The kernel's receive stamps: when bytes arrived, not when the reader got to them."""

from __future__ import annotations

import os
import socket
import time

import pytest

from load import kernel_stamps


def test_a_read_carries_the_arrival_not_the_read() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as ours:
        kernel_stamps.ask(ours)
        theirs, _ = server.accept()
        with theirs, kernel_stamps.stamping():
            sent = time.time()
            theirs.sendall(b"answer")
            time.sleep(0.3)  # a reader late by this much
            chunk, stamp = kernel_stamps.receive(ours)
    assert chunk == b"answer" and stamp is not None
    assert sent <= stamp < sent + 0.2 < sent + 0.3 <= time.time()


def test_a_socket_that_did_not_ask_gets_no_stamp() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as ours:
        theirs, _ = server.accept()
        with theirs:
            theirs.sendall(b"answer")
            chunk, stamp = kernel_stamps.receive(ours)
    assert (chunk, stamp) == (b"answer", None)


def test_stamping_runs_its_block_after_a_timeout_and_lets_its_errors_through() -> None:
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="the caller's"), kernel_stamps.stamping(timeout_s=0):
        raise ValueError("the caller's")  # reached: no wait at all, and nothing of ours swallows it
    assert set(os.listdir("/proc/self/fd")) == before  # its sockets closed
