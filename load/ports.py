"""A free TCP port on loopback for a server started later, outside the kernel's ephemeral range.

A port from `bind(("127.0.0.1", 0))` is free only until the kernel hands the same number to an outgoing
connection, which it does from the ephemeral range (`net.ipv4.ip_local_port_range`) that port 0 draws
from too. Between choosing a port and a Ray Serve proxy binding it, a starting Ray cluster opens hundreds
of connections: a clean-clone `make test` lost its whole integration session to "Failed to bind to
address '127.0.0.1:38501'" (stop 22). A port below that range is never given to an outgoing connection.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: ports that well-known services may claim


def ephemeral_start(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(rng: random.Random | None = None, path: Path = EPHEMERAL_RANGE) -> int:
    """A port that nothing on 127.0.0.1 holds now, from below the ephemeral range, in random order so
    that concurrent callers rarely pick the same one."""
    candidates = list(range(LOWEST, max(LOWEST + 1, ephemeral_start(path))))
    (rng or random.Random()).shuffle(candidates)
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # taken: try the next
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {LOWEST} and the ephemeral range")
