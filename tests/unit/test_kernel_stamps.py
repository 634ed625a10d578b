"""The kernel's receive stamps: when bytes arrived, not when the reader got to them."""

from __future__ import annotations

import socket
import time

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
