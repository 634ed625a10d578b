"""The kernel's receive stamps: when an answer's bytes reached a TCP socket, however late its reader got to them.

Linux stamps each received segment with the wall-clock time it arrived (`SO_TIMESTAMPNS`, a struct
timespec) for a socket that asks. A read returns the stamp of the latest segment it took: queued segments
are merged, the merged one carrying the later stamp. Read against the wall clock taken just before the
request was written, that is the server's own time to answer on loopback (at most a little over),
without the reading process's wait for a CPU: on two cores shared with the load that wait is tens of ms.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

# The `socket` module does not name it (nor its SCM_ message type, the same number).
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("qq")


def ask(sock: socket.socket) -> None:
    """Have the kernel stamp what `sock` receives."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def receive(sock: socket.socket, size: int = 65536) -> tuple[bytes, float | None]:
    """Up to `size` bytes from `sock` and the kernel's stamp of the latest segment among them (Unix time;
    None when it gave none)."""
    chunk, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(TIMESPEC.size))
    return chunk, stamp(ancillary)


def stamp(ancillary: Iterable[tuple[int, int, bytes]]) -> float | None:
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = TIMESPEC.unpack(raw[: TIMESPEC.size])
            return float(sec + nsec / 1e9)
    return None


@contextmanager
def stamping(timeout_s: float = 1.0) -> Iterator[None]:
    """Entered once the kernel stamps the TCP segments it receives (or after `timeout_s`: the first answers
    may then go unstamped); until the block ends, stamps stay on for every socket that asks.

    Linux stamps received packets only while some socket on the machine asks for stamps. It turns that on
    in a deferred work item after the first one asks, and off the same way after the last one closes:
    segments that arrive in between are not stamped at all (3 of 20 first segments on loopback, in fresh
    processes here; in CI, an answer on a probe connection that had closed and reopened). So one asking
    socket of our own stays open for the whole block, whatever the caller's connections do meanwhile."""
    deadline = time.monotonic() + timeout_s
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as ours:
        ask(ours)
        theirs, _ = server.accept()
        with theirs:
            while time.monotonic() < deadline:
                theirs.sendall(b"x")
                _, when = receive(ours, 1)
                if when is not None:
                    break
                time.sleep(0.001)
            yield
