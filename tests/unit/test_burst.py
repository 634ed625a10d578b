"""load/burst.py: simultaneous bursts, each answer classified."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable

from load.burst import Answer, Reception, burst, classify, connect, markdown, request_bytes

SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\ndata: [DONE]\n\n"
REFUSAL = b'HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n\r\n{"error": {"message": "busy"}}'
PLAIN = b"HTTP/1.1 503 Service Unavailable\r\n\r\nRequest dropped due to backpressure"
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def burst_against(serve: Serve, n: int) -> list[Answer | str]:
    """A burst of `n` one-token requests against a local server whose connections `serve` handles."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await burst(f"http://127.0.0.1:{port}", "m", n, 1, 8, seed=0)


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


def test_markdown_has_a_row_per_burst() -> None:
    ms = {"n": 1, "mean": 1.0, "p50": 1.0, "p95": 1.0, "p99": 2.0, "max": 3.0}
    row = {"target": "graph", "round": 0, "requests": 400, "max_tokens": 256, "refusal_ms": ms,
           "outcomes": {"served": 64, "refused": 330, "HTTP 500": 6}, "served_first_byte_ms": ms,
           "served_done_ms": ms, "wall_s": 1.0, "health": ms | {"failures": 0}}  # fmt: skip
    arrival = ms | {"p50": 0.5, "p99": 0.7, "max": 0.9}
    vllm = row | {"target": "vllm", "outcomes": {"served": 400}}
    table = markdown({"rows": [row | {"refusal_arrival_ms": arrival}, vllm]})
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| graph | 0 | 400 x 256 | 64 | 330 | 6 HTTP 500 | 1 | 2 | 3 | 0 | 1 | 1 |")
    # The last served answer's end: the one done time that results from before each answer's own are right in.
    assert lines[2].endswith("| 1 | 2 | 3 | 2.0 | 3.0 |")
    assert lines[3].startswith("| vllm | 0 | 400 x 256 | 400 | 0 | 0 | 1 | 2 | 3 | - | - | - |")
