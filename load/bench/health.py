"""`/health` latency probes, run beside the load from a process of their own: a server whose event loop
stalls shows here first.

Each answer is timed twice: on the probe process's clock (`latency`, what a prober waits), and from just
before the request was written to the kernel's receive stamp of the answer's last bytes (`stamped`,
load/kernel_stamps.py): the server's own time, without the probe process's wait for a CPU to read it,
which on two cores shared with the load is most of the first's p99.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import select
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

from load import kernel_stamps
from load.stats import percentile, summary_ms

# A probe unanswered this long fails; one that takes anywhere near it shows in the maximum either way.
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HealthSample:
    sent_at: float  # perf_counter
    latency: float  # seconds until answered, or until the failure
    status: int | None
    error: str | None = None
    # A probe of another server sent at the same instant by the same process (load.health_probe's floor):
    # what the two share (this process waking, the machine's load) cancels in the difference.
    beside: HealthSample | None = None
    # Seconds from just before the request was written to the kernel's stamp of the answer's last bytes;
    # None for a failure or an answer the kernel did not stamp.
    stamped: float | None = None


class HealthConnection:
    """A keep-alive HTTP/1.1 connection to one server's `GET /health`, opened again after a failure or a
    `Connection: close`."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(f"/health is probed over plain http, not {base_url!r}")
        self._address = (url.hostname, url.port or 80)
        self._request = f"GET {url.path.rstrip('/')}/health HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode()
        self._sock: socket.socket | None = None
        self._data = bytearray()
        self._sent_at = self._sent_wall = 0.0
        self._stamp: float | None = None
        self._sample: HealthSample | None = None  # the last probe's, once it ended

    def fileno(self) -> int:  # for `select`, while a probe is being read
        assert self._sock is not None
        return self._sock.fileno()

    def send(self) -> bool:
        """Writes a probe (connecting first if need be); False if that already failed."""
        self._data.clear()
        self._stamp = self._sample = None
        self._sent_at = time.perf_counter()
        # A server may close a kept-alive connection between probes (its idle timeout): readable now, it has.
        if self._sock is not None and select.select([self._sock], [], [], 0)[0]:
            self.close()
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self._address, timeout=TIMEOUT_S)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                kernel_stamps.ask(self._sock)
            self._sent_wall = time.time()
            self._sock.sendall(self._request)
        except OSError as exc:
            self.fail(exc)
            return False
        return True

    def readable(self) -> bool:
        """Reads what came; True once the probe ended (answered or failed)."""
        assert self._sock is not None
        try:
            chunk, stamp = kernel_stamps.receive(self._sock)
        except OSError as exc:
            self.fail(exc)
            return True
        self._data += chunk
        if chunk:  # the latest data's stamp: the answer's last bytes, once it is whole (the end of a stream has none)
            self._stamp = stamp
        try:
            parsed = _answer(bytes(self._data), ended=not chunk)
        except ValueError as exc:
            self.fail(exc)
            return True
        if parsed is None:
            if not chunk:
                self.fail(ConnectionError("closed before the answer ended"))
            return not chunk
        status, keep_alive = parsed
        stamped = None if self._stamp is None else self._stamp - self._sent_wall
        self._sample = HealthSample(self._sent_at, time.perf_counter() - self._sent_at, status, stamped=stamped)
        if not keep_alive:
            self.close()
        return True

    def ended(self) -> HealthSample:
        assert self._sample is not None, "read before the probe ended"
        return self._sample

    def fail(self, error: Exception) -> None:
        self._sample = HealthSample(self._sent_at, time.perf_counter() - self._sent_at, None, type(error).__name__)
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _answer(data: bytes, ended: bool) -> tuple[int, bool] | None:
    """(status, whether the connection stays open) once `data` holds a whole answer; None before."""
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return None
    status_line, *lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if not status_line.startswith(b"HTTP/") or len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"no HTTP answer: {status_line[:40]!r}")
    status = int(parts[1])
    headers = {name.strip().lower(): value.strip().lower() for name, _, value in (h.partition(b":") for h in lines)}
    connection = {token.strip() for token in headers.get(b"connection", b"").split(b",")}
    # HTTP/1.1 keeps a connection open unless told otherwise; HTTP/1.0 only when told to (RFC 9112, 9.3).
    keep_alive = b"close" not in connection if parts[0] != b"HTTP/1.0" else b"keep-alive" in connection
    if status < 200 or status in (204, 304):  # never a body (RFC 9112, 6.3)
        whole = True
    elif b"content-length" in headers:
        whole = len(body) >= int(headers[b"content-length"])
    elif headers.get(b"transfer-encoding") == b"chunked":
        whole = body.endswith(b"0\r\n\r\n")  # the last chunk (a health answer's body has no "0\r\n\r\n")
    else:  # the body runs to the connection's end
        whole, keep_alive = ended, False
    return (status, keep_alive) if whole else None


def probe_once(connections: Sequence[HealthConnection]) -> list[HealthSample]:
    """One probe of each connection's server: all written, then each answer read as it comes."""
    pending = [c for c in connections if c.send()]
    deadline = time.monotonic() + TIMEOUT_S
    while pending:
        ready, _, _ = select.select(pending, [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            for connection in pending:
                connection.fail(TimeoutError())
            break
        pending = [c for c in pending if not (c in ready and c.readable())]
    return [c.ended() for c in connections]


def probe_until(told: Connection, connections: Sequence[HealthConnection], interval_s: float) -> list[HealthSample]:
    """Probes started every `interval_s`, one at a time, until `told` has a message; the first connection's
    samples, each with the others' of the same instant `beside` it (load.health_probe's floor).

    A probe that outlasts the interval delays the next one instead of piling up: the samples then
    thin out, and the long one shows in the maximum.
    """
    samples: list[HealthSample] = []
    next_at = time.perf_counter()
    while True:
        sample, *others = probe_once(connections)
        samples.append(dataclasses.replace(sample, beside=others[0]) if others else sample)
        next_at = max(next_at + interval_s, time.perf_counter())
        if told.poll(max(0.0, next_at - time.perf_counter())):
            return samples


PROCESS_NAME = "health-probe"


class ProbeProcess:
    """`probe_until` run in a process of its own, from entering the `with` until `stop()`, which returns its
    samples (`sent_at` on the same monotonic clock as this process's perf_counter).

    A load client that saturates its own event loop (hundreds of connections, 300 KB bodies) times
    every probe on that loop by its own stall as much as by the server's: `/health` p99 of 2.2-2.7 s
    for both targets with half a core idle on the server's side, 10-30 ms from a process of its own.

    It also leaves the client's session (`own_session`), as a real prober (a kubelet, a load balancer) is not
    in the load generator's: with the kernel's autogroups a session shares the CPU as one, so a probe in the
    saturated client's session waits behind the client as well as behind the server (stops 18-53 probed
    from there: docs/benchmarks-notes.md, stop54).
    """

    def __init__(self, url: str, interval_s: float, beside: str | None = None, own_session: bool = True) -> None:
        # Made here, unconnected, so that a URL it cannot probe fails in this process, not in the child.
        connections = [HealthConnection(each) for each in (url, beside) if each is not None]
        spawn = multiprocessing.get_context("spawn")
        self._parent, child = spawn.Pipe()
        args = (child, connections, interval_s, own_session)
        self._process = spawn.Process(target=_probe_until_told, args=args, daemon=True, name=PROCESS_NAME)

    def __enter__(self) -> ProbeProcess:
        self._process.start()
        self._parent.recv()  # "ready": imported and probing
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.kill()  # after stop() it has already ended
        self._process.join()

    def stop(self) -> list[HealthSample]:
        self._parent.send("stop")
        samples: list[HealthSample] = self._parent.recv()
        self._process.join()
        return samples


def _probe_until_told(
    told: Connection, connections: list[HealthConnection], interval_s: float, own_session: bool
) -> None:
    if own_session:
        os.setsid()
    # One probe not recorded: a fresh process's first request pays for its connection, which then stood
    # among the top 1 % of a minute's probes of any server, idle or loaded (27-30 ms against 1 ms).
    probe_once(connections)
    with kernel_stamps.stamping():
        told.send("ready")
        told.send(probe_until(told, connections, interval_s))
    for connection in connections:
        connection.close()


async def loop_lag(stop: asyncio.Event, interval_s: float = 0.01) -> list[float]:
    """How late this client's own event loop wakes a 10 ms sleeper, until `stop` is set.

    Request times are all taken on this loop: while it lags, the client is slow, not the server, and long
    ITLs of that moment are the client's own (`/health` is probed from a process of its own).
    """
    lags = []
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(interval_s)
        lags.append(max(0.0, time.perf_counter() - before - interval_s))
    return lags


def per_second(samples: Sequence[HealthSample], t0: float) -> list[list[float | int]]:
    """The samples in one-second bins from `t0`: [second, probes, p50 ms, max ms, not 200], for plots
    and result files that must stay small (a probe every 100 ms is thousands per run)."""
    bins: dict[int, list[HealthSample]] = {}
    for s in samples:
        bins.setdefault(int(s.sent_at - t0), []).append(s)
    series: list[list[float | int]] = []
    for second in sorted(bins):
        ms = [s.latency * 1000 for s in bins[second]]
        failures = sum(s.status != 200 for s in bins[second])
        series.append([second, len(ms), round(percentile(ms, 50), 3), round(max(ms), 3), failures])
    return series


def summarize(samples: Sequence[HealthSample]) -> dict[str, Any]:
    """Latency in ms (n, mean, p50, p95, p99, max) of every probe, and how many were not a 200."""
    summary: dict[str, Any] = dict(summary_ms([s.latency for s in samples]))
    summary["failures"] = sum(s.status != 200 for s in samples)
    return summary


def summarize_stamped(samples: Sequence[HealthSample]) -> dict[str, Any]:
    """The answered probes' `stamped` times in ms (n, mean, p50, p95, p99, max), and how many answered
    probes the kernel did not stamp."""
    answered = [s for s in samples if s.status is not None]
    stamped = [s.stamped for s in answered if s.stamped is not None]
    return {**summary_ms(stamped), "unstamped": len(answered) - len(stamped)}
