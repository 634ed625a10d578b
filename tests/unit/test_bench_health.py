"""The /health probe's pacing, stamps and failure recording, and the client's own event-loop lag."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from load import kernel_stamps
from load.bench.health import (
    PROCESS_NAME,
    HealthConnection,
    ProbeProcess,
    loop_lag,
    probe_once,
    probe_until,
    summarize,
    summarize_stamped,
)
from load.ports import free_port
from tests.unit.bench_support import serving


@contextmanager
def answering(answers: Iterator[bytes], delay_s: float = 0.0) -> Iterator[str]:
    """A server on a real port that answers each request on a connection with the next of `answers`,
    `delay_s` after reading it; a connection is closed after an answer with `Connection: close` (or, without
    saying so, `X-Then-Close`)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(delay_s)
                answer = next(answers)
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer or b"X-Then-Close" in answer:
                    break
        writer.close()

    started = threading.Event()
    port = free_port()
    stop: list[Callable[[], object]] = []

    async def main() -> None:
        stopped = asyncio.Event()
        stop.append(functools.partial(asyncio.get_running_loop().call_soon_threadsafe, stopped.set))
        async with await asyncio.start_server(serve, "127.0.0.1", port):
            started.set()
            await stopped.wait()

    # asyncio.run cancels the connections' handlers still waiting when it ends.
    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop[0]()
        thread.join(10)


def ok(status: int = 200, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n{extra}\r\n{{}}".encode()


def test_probes_every_interval_and_counts_non_200() -> None:
    parent, child = multiprocessing.Pipe()
    with answering(itertools.cycle([ok(200), ok(503)])) as url:
        threading.Timer(0.35, parent.send, args=("stop",)).start()
        samples = probe_until(child, [HealthConnection(url)], 0.1)
    # 4 probes at 0, 0.1, 0.2, 0.3 s; 3 if this busy machine delays one (never more than one per interval).
    assert [s.status for s in samples] == [200, 503, 200, 503][: len(samples)] and len(samples) >= 3
    # On schedule, never early: a probe this busy machine woke late is followed by the next on time.
    offsets = [s.sent_at - samples[0].sent_at for s in samples]
    assert all(0.1 * k - 0.005 < offset < 0.1 * k + 0.1 for k, offset in enumerate(offsets)), offsets
    summary = summarize(samples)
    assert (summary["n"], summary["failures"]) == (len(samples), len(samples) // 2)


def test_unanswered_probes_are_samples() -> None:
    connection = HealthConnection(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    samples = [sample for _ in range(2) for sample in probe_once([connection])]
    assert [(s.status, s.error, s.stamped) for s in samples] == [(None, "ConnectionRefusedError", None)] * 2
    assert summarize(samples)["failures"] == 2 and summarize_stamped(samples)["n"] == 0


def test_the_stamped_time_leaves_out_the_probes_own_wait_to_read() -> None:
    with answering(itertools.repeat(ok())) as url:
        connection = HealthConnection(url)
        probe_once([connection])  # connected
        with kernel_stamps.stamping():
            assert connection.send()
            time.sleep(0.3)  # a probe process waiting for a CPU while the answer waits in the kernel
            while not connection.readable():
                pass
            sample = connection.ended()
    assert sample.status == 200 and sample.stamped is not None
    assert 0 < sample.stamped < 0.2 < 0.3 <= sample.latency
    ms = sample.stamped * 1000
    summary = summarize_stamped([sample])
    assert summary == {"n": 1, "mean": summary["mean"], "p50": ms, "p95": ms, "p99": ms, "max": ms, "unstamped": 0}
    assert summary["mean"] == pytest.approx(ms)


def test_answers_end_by_length_chunks_or_close_and_anything_else_fails() -> None:
    answers = [
        b"HTTP/1.1 204 No Content\r\n\r\n",  # no body, and no length to say so
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        ok(200, "Connection: close\r\n"),
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",  # HTTP/1.0: closed unless kept alive
        b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nuntil the end",
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ]
    # The probe's connection closes and reopens between answers: with no socket asking, Linux would turn
    # stamps off and on in deferred work; `stamping()` keeps them on, as `_probe_until_told` does.
    with answering(iter(answers)) as url, kernel_stamps.stamping():
        connection = HealthConnection(url)
        samples = [sample for _ in answers for sample in probe_once([connection])]
    assert [(s.status, s.error) for s in samples] == [(204, None), (200, None), (200, None), (200, None), (200, None),
                                                      (None, "ValueError")]  # fmt: skip
    # An answer's stamp is its last bytes', also when the connection's end ends it.
    assert all(s.stamped is not None for s in samples[:-1])


def test_a_connection_the_server_closed_between_probes_is_opened_again() -> None:
    with answering(itertools.repeat(ok(200, "X-Then-Close: 1\r\n"))) as url:
        connection = HealthConnection(url)
        first = probe_once([connection])
        time.sleep(0.1)  # the server has closed the kept-alive connection
        second = probe_once([connection])
    assert [(s.status, s.error) for s in first + second] == [(200, None), (200, None)]


def test_a_url_the_probe_cannot_reach_fails_before_the_process_starts() -> None:
    with pytest.raises(ValueError, match="plain http"):
        ProbeProcess("https://127.0.0.1:1", 0.1)


def test_each_probe_carries_the_one_sent_beside_it() -> None:
    parent, child = multiprocessing.Pipe()
    with answering(itertools.repeat(ok(200))) as target, answering(itertools.repeat(ok(503))) as floor:
        threading.Timer(0.25, parent.send, args=("stop",)).start()
        samples = probe_until(child, [HealthConnection(target), HealthConnection(floor)], 0.05)
    assert len(samples) >= 2
    assert all(s.status == 200 and s.beside is not None and s.beside.status == 503 for s in samples)
    assert all(s.beside is not None and abs(s.beside.sent_at - s.sent_at) < 0.05 for s in samples)


def test_a_probe_beside_another_is_read_as_it_comes() -> None:
    with answering(itertools.repeat(ok()), delay_s=0.3) as slow, answering(itertools.repeat(ok())) as fast:
        connections = [HealthConnection(slow), HealthConnection(fast)]
        probe_once(connections)
        target, floor = probe_once(connections)
    assert target.latency >= 0.3 > 0.2 > floor.latency and target.status == floor.status == 200


async def test_loop_lag_sees_a_blocked_loop() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(loop_lag(stop))
    await asyncio.sleep(0.05)
    time.sleep(0.1)  # what a CPU-bound client would do to every timestamp it takes
    await asyncio.sleep(0.05)
    stop.set()
    lags = await task
    assert max(lags) >= 0.08
    assert sorted(lags)[len(lags) // 2] < 0.03


async def test_a_probe_process_probes_until_stopped_on_this_processs_clock() -> None:
    app = FastAPI()
    served: list[float] = []

    def health() -> JSONResponse:
        served.append(time.perf_counter())
        return JSONResponse({})

    app.get("/health")(health)
    with serving(app) as url, ProbeProcess(url, 0.05) as prober:
        started = time.perf_counter()
        await asyncio.sleep(0.3)
        samples = prober.stop()
        stopped = time.perf_counter()
    assert len(samples) >= 3 and all(s.status == 200 for s in samples)
    assert started - 1.0 < samples[0].sent_at and samples[-1].sent_at < stopped
    assert len(served) == len(samples) + 1  # the first, the client's own warm-up, is not a sample


async def test_a_probe_process_leaves_the_clients_session_unless_told_not_to() -> None:
    app = FastAPI()
    app.get("/health")(lambda: JSONResponse({}))
    with serving(app) as url:
        for own_session in (False, True):
            with ProbeProcess(url, 0.05, own_session=own_session) as prober:
                (child,) = [p for p in multiprocessing.active_children() if p.name == PROCESS_NAME]
                assert child.pid is not None
                assert (os.getsid(child.pid) == child.pid) is own_session
                assert (os.getsid(child.pid) == os.getsid(0)) is not own_session
                prober.stop()
