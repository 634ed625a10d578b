"""load/burst.py: simultaneous bursts, each answer classified."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from load import burst as burst_module
from load import kernel_stamps
from load.burst import (
    Answer,
    Reception,
    burst,
    classify,
    connect,
    markdown,
    parse_args,
    request_bytes,
    run,
)

SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\ndata: [DONE]\n\n"
REFUSAL = b'HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n\r\n{"error": {"message": "busy"}}'
PLAIN = b"HTTP/1.1 503 Service Unavailable\r\n\r\nRequest dropped due to backpressure"
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def burst_against(serve: Serve, n: int, timeout_s: float = 60.0) -> list[Answer | str]:
    """A burst of `n` one-token requests against a local server whose connections `serve` handles."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await burst(f"http://127.0.0.1:{port}", "m", n, 1, 8, seed=0, timeout_s=timeout_s)


def test_classify() -> None:
    assert classify(200, b"", b"data: {}\n\ndata: [DONE]\n\n") == "served"
    assert classify(200, b"", b"data: {}\n\n") == "broken stream"
    assert classify(503, b"HTTP/1.1 503\r\nRetry-After: 1\r\n\r\n", b'{"error": {}}') == "refused"
    assert classify(503, b"HTTP/1.1 503\r\n\r\n", b'{"error": {}}') == "HTTP 503 (not OpenAI JSON + Retry-After)"
    assert classify(503, b"HTTP/1.1 503\r\nretry-after: 1\r\n\r\n", b"dropped") == (
        "HTTP 503 (not OpenAI JSON + Retry-After)"
    )
    assert classify(500, b"", b"") == "HTTP 500"


def test_request_bytes_is_one_complete_request() -> None:
    raw = request_bytes("h:1", "/v1/completions", {"prompt": "hi"})
    head, body = raw.split(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: h:1\r\n")
    assert f"Content-Length: {len(body)}".encode() in head and json.loads(body) == {"prompt": "hi"}


async def test_a_burst_gets_every_answer() -> None:
    seen = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        head = await reader.readuntil(b"\r\n\r\n")
        headers = dict(line.partition(b": ")[::2] for line in head.split(b"\r\n")[1:] if line)
        await reader.readexactly(int(headers[b"Content-Length"]))
        seen += 1
        answer = [SSE, REFUSAL, PLAIN][seen % 3]
        if seen == 1:
            await asyncio.sleep(0.5)  # the first answer is late: its arrival time says so
        writer.write(answer)
        await writer.drain()
        writer.close()

    answers = await burst_against(serve, 30)
    kinds = sorted(a.kind for a in answers if isinstance(a, Answer))
    assert kinds.count("served") == kinds.count("refused") == 10
    assert kinds.count("HTTP 503 (not OpenAI JSON + Retry-After)") == 10
    arrivals = sorted(a.arrival_s or 0 for a in answers if isinstance(a, Answer))
    assert arrivals[0] > 0 and arrivals[-2] < 0.4 < 0.5 <= arrivals[-1] < 2
    # Each answer's end is its own, not the burst's: only the late one ends after 0.4 s.
    ends = sorted(a.done_s for a in answers if isinstance(a, Answer))
    assert ends[-2] < 0.4 < 0.5 <= ends[-1]


async def test_a_connection_reset_is_reported_not_raised() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
        writer.transport.abort()

    answers = await burst_against(serve, 3)
    assert answers == ["connection (ConnectionResetError)"] * 3


async def test_an_answer_read_to_its_end_leaves_the_loop() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    fd = ours.fileno()
    reception = Reception(ours)
    theirs.sendall(REFUSAL)
    theirs.close()
    await asyncio.wait_for(reception.done, 5)
    answer = reception.result(time.perf_counter())
    assert isinstance(answer, Answer) and answer.kind == "refused"
    # A closed socket stays readable: still registered, it would wake the loop for as long as the burst lasts.
    assert not asyncio.get_running_loop().remove_reader(fd) and ours.fileno() == -1


async def test_the_arrival_is_the_kernels_stamp_not_when_the_loop_reads() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ours = await connect(socket.AF_INET, listener.getsockname())
    theirs, _ = listener.accept()
    with kernel_stamps.stamping():
        reception = Reception(ours)
        await reception.send(b"GET / HTTP/1.1\r\n\r\n")
        theirs.recv(100)  # read before closing, or the close resets the connection
        theirs.sendall(REFUSAL)
        theirs.close()
        time.sleep(0.3)  # this loop is busy: the answer waits in the kernel
        await asyncio.wait_for(reception.done, 5)
    listener.close()
    answer = reception.result(time.perf_counter())
    assert isinstance(answer, Answer) and answer.arrival_s is not None
    assert answer.arrival_s < 0.2 < 0.3 <= time.time() - reception.sent_wall


async def test_a_connection_closed_without_an_answer_is_reported_not_raised() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    answers = await burst_against(serve, 3)
    assert answers == ["connection (ConnectionError)"] * 3


async def test_an_answer_that_never_comes_is_reported_after_the_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(30)  # holds the connection open, answering nothing

    answers = await asyncio.wait_for(burst_against(serve, 3, timeout_s=0.3), 10)
    assert answers == ["no answer in time"] * 3


async def test_each_burst_of_a_round_has_prompts_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[tuple[str, int, int]] = []

    async def measure(url: str, n: int, max_tokens: int, opts: Any, seed: int) -> dict[str, Any]:
        seeds.append((url, n, seed))
        return {}

    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(burst_module, "measure", measure)
    monkeypatch.setattr(asyncio, "sleep", sleep)  # load.burst's asyncio: the same module
    opts = parse_args(["--requests", "400", "--max-tokens", "256", "--requests", "200", "--max-tokens", "1",
                       "--rounds", "2", "--pause", "5"])  # fmt: skip
    await run({"a": "A", "b": "B"}, opts)
    # The same prompts for every target, never the same for two bursts (the engine's prefix cache).
    assert seeds == [("A", 400, 0), ("B", 400, 0), ("A", 200, 1), ("B", 200, 1),
                     ("A", 400, 2), ("B", 400, 2), ("A", 200, 3), ("B", 200, 3)]  # fmt: skip
    assert sleeps == [5.0] * 7  # between bursts, not after the last


def test_markdown_has_a_row_per_burst() -> None:
    ms = {"n": 1, "mean": 1.0, "p50": 1.0, "p95": 1.0, "p99": 2.0, "max": 3.0}
    row = {"target": "graph", "round": 0, "requests": 400, "max_tokens": 256, "refusal_ms": ms,
           "outcomes": {"served": 64, "refused": 330, "HTTP 500": 6}, "served_first_byte_ms": ms,
           "served_done_ms": ms, "wall_s": 1.0, "health": ms | {"failures": 0}}  # fmt: skip
    arrival = ms | {"p50": 0.5, "p99": 0.7, "max": 0.9}
    vllm = row | {"target": "vllm", "outcomes": {"served": 400}}
    stamped = ms | {"p99": 0.4, "unstamped": 0}
    table = markdown({"rows": [row | {"refusal_arrival_ms": arrival, "health_stamped": stamped}, vllm]})
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| graph | 0 | 400 x 256 | 64 | 330 | 6 HTTP 500 | 1 | 2 | 3 | 0 | 1 | 1 |")
    # The last served answer's end: the one done time that results from before each answer's own are right in.
    assert lines[2].endswith("| 1 | 2 | 3 | 2.0 | 3.0 | 0.4 |")
    assert lines[3].endswith("| 2.0 | 3.0 | - |")  # a result from before the stamps
    assert lines[3].startswith("| vllm | 0 | 400 x 256 | 400 | 0 | 0 | 1 | 2 | 3 | - | - | - |")
