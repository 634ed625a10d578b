"""Simultaneous bursts: N requests that reach the server in the same few milliseconds, per target.

A ramp lets admission see the load coming; a burst is what a retry storm or a batch job sends. All N
connections are opened first, then every request is written in one pass (a few ms for hundreds).
Per request: status, whether a refusal is OpenAI JSON with Retry-After, time to the answer's first
byte, and for a 200 stream whether it ended with `[DONE]`. A refusal's time is read twice: as this
process sees it, from the burst's first write (its loop, busy with hundreds of connections on the
server's cores, adds tens of ms), and at arrival, from the request's own write to the kernel's receive
stamp on the answer's first read (`Reception`): on loopback, the server's own time (queueing in its
proxy, parsing, admission), at most a little over. `/health` is probed through the burst. Targets take
turns, for --rounds rounds.

  python -m load.burst --start graph:configs/cpu-tiny.yaml@tiny-chat --start vllm:configs/cpu-tiny.yaml@tiny-chat \\
      --requests 400 --max-tokens 256 --requests 200 --max-tokens 1 --out results/burst.json

Each `--requests` pairs with the `--max-tokens` at the same position (one scenario each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from load import kernel_stamps
from load.bench import targets
from load.bench.datasets import WORDS
from load.bench.health import ProbeProcess, summarize, summarize_stamped
from load.meta import run_meta, save_result
from load.stats import summary_ms


@dataclass
class Answer:
    status: int
    kind: str  # "served", "refused" (503/429 OpenAI JSON + Retry-After) or what else it was
    first_byte_s: float  # from the burst's first write to this process seeing the answer's first byte
    done_s: float  # from the burst's first write to this process seeing the answer end
    # From this request's write to the kernel's receive stamp on the first bytes read (None: no stamp).
    arrival_s: float | None


def request_bytes(host: str, path: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + payload


def classify(status: int, headers: bytes, body: bytes) -> str:
    if status == 200:
        return "served" if b"data: [DONE]" in body else "broken stream"
    if status in (503, 429):
        openai = body.lstrip().startswith(b'{"error"') or b'\r\n{"error"' in body
        retry_after = b"\r\nretry-after:" in headers.lower()
        if openai and retry_after:
            return "refused"
        return f"HTTP {status} (not OpenAI JSON + Retry-After)"
    return f"HTTP {status}"


class Reception:
    """One request written and its answer read as it comes (`Connection: close` ends it). A read also
    returns the kernel's stamp of the latest segment it took (merged segments carry the later one), so
    the first read's stamp bounds from above when the first bytes arrived, however late this process's
    loop gets to them: with hundreds of connections and the server on the same two cores, the loop alone
    adds tens of ms."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = bytearray()
        self.sent_wall = self.seen = self.ended = 0.0
        self.arrived_wall: float | None = None
        self.status = 0
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.loop.add_reader(sock.fileno(), self._readable)

    async def send(self, payload: bytes) -> None:
        self.sent_wall = time.time()
        try:
            await self.loop.sock_sendall(self.sock, payload)  # a few KB into an empty buffer: at once
        except OSError as exc:
            self._finish(exc)

    def _readable(self) -> None:
        try:
            chunk, stamp = kernel_stamps.receive(self.sock)
        except BlockingIOError:
            return
        except OSError as exc:
            return self._finish(exc)
        if chunk and not self.data:
            self.seen = time.perf_counter()
            self.arrived_wall = stamp
        self.data += chunk
        if chunk:
            return
        status = self.data.split(b" ", 2)[1] if self.data.startswith(b"HTTP/") else b""
        if not status.isdigit():
            return self._finish(ConnectionError(f"no HTTP answer: {bytes(self.data[:40])!r}"))
        self.status = int(status)
        self._finish(None)

    def _stop(self) -> None:
        # A closed socket stays readable: left registered, it would wake this loop without end.
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

    def _finish(self, error: Exception | None) -> None:
        if self.done.done():  # a failed write after the answer ended, or the other way round
            return
        self.ended = time.perf_counter()
        self._stop()
        if error is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(error)

    def abandon(self) -> None:
        """Stops reading an answer that has not ended (the burst was cancelled)."""
        if not self.done.done():
            self._stop()
            self.done.cancel()

    def result(self, sent: float) -> Answer | str:
        """The answer, or what became of the connection; `sent`: the burst's first write (perf_counter)."""
        if self.done.cancelled():
            return "no answer in time"
        error = self.done.exception()
        if error is not None:
            return f"connection ({type(error).__name__})"
        head, _, body = bytes(self.data).partition(b"\r\n\r\n")
        arrival = None if self.arrived_wall is None else self.arrived_wall - self.sent_wall
        return Answer(self.status, classify(self.status, head + b"\r\n\r\n", body), self.seen - sent,
                      self.ended - sent, arrival)  # fmt: skip


async def connect(family: int, address: Any) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        kernel_stamps.ask(sock)
        await asyncio.get_running_loop().sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


async def burst(
    url: str, model: str, n: int, max_tokens: int, input_words: int, seed: int, timeout_s: float = 600.0
) -> list[Answer | str]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    rng = random.Random(seed)
    bodies = [request_bytes(f"{host}:{port}", parts.path + "/v1/completions", {
        "model": model, "prompt": " ".join(rng.choice(WORDS) for _ in range(input_words)),
        "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
    }) for _ in range(n)]  # fmt: skip
    loop = asyncio.get_running_loop()
    family, _, _, _, address = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
    connected = await asyncio.gather(*(connect(family, address) for _ in range(n)), return_exceptions=True)
    receptions = {i: Reception(c) for i, c in enumerate(connected) if isinstance(c, socket.socket)}
    try:
        with kernel_stamps.stamping():
            sent = time.perf_counter()
            for i, reception in receptions.items():
                await reception.send(bodies[i])
            if receptions:
                await asyncio.wait([r.done for r in receptions.values()], timeout=timeout_s)
    finally:
        # Answers still open: the burst was cancelled, or the server kept them past the timeout.
        for reception in receptions.values():
            reception.abandon()
    return [
        receptions[i].result(sent) if i in receptions else f"connection ({type(c).__name__})"
        for i, c in enumerate(connected)
    ]


async def measure(url: str, n: int, max_tokens: int, opts: argparse.Namespace, seed: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
    with ProbeProcess(url, 0.05) as health:  # the burst's 400 connections stall this process's loop
        started = time.perf_counter()
        answers = await burst(url, model, n, max_tokens, opts.input_words, seed, opts.timeout)
        wall = time.perf_counter() - started
        samples = health.stop()
    kinds = Counter(a.kind if isinstance(a, Answer) else a for a in answers)
    ok = [a for a in answers if isinstance(a, Answer)]
    return {
        "requests": n,
        "max_tokens": max_tokens,
        "outcomes": dict(kinds),
        "refusal_ms": summary_ms([a.first_byte_s for a in ok if a.kind == "refused"]),
        "refusal_arrival_ms": summary_ms([a.arrival_s for a in ok if a.kind == "refused" and a.arrival_s is not None]),
        "served_first_byte_ms": summary_ms([a.first_byte_s for a in ok if a.kind == "served"]),
        "served_done_ms": summary_ms([a.done_s for a in ok if a.kind == "served"]),
        "wall_s": wall,
        "health": summarize(samples),
        "health_stamped": summarize_stamped(samples),
    }


def markdown(result: dict[str, Any]) -> str:
    """One row per burst: what became of its requests, how fast refusals came, `/health` meanwhile (ms)."""
    lines = [
        "| target | round | requests x max_tokens | served | refused (JSON + Retry-After) | other | "
        "refusal p50 | p99 | max | at arrival p50 | p99 | max | served first byte p50 | p99 | served done max | "
        "/health p99 | max | stamped p99 |",
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        outcomes = dict(row["outcomes"])
        served, refused = outcomes.pop("served", 0), outcomes.pop("refused", 0)
        other = ", ".join(f"{n} {kind}" for kind, n in outcomes.items()) or "0"
        r, f, d, h = row["refusal_ms"], row["served_first_byte_ms"], row["served_done_ms"], row["health"]
        a = row.get("refusal_arrival_ms")  # results before stop 37 have none
        arrival = f"{a['p50']:.0f} | {a['p99']:.0f} | {a['max']:.0f}" if a else "- | - | -"
        stamped = row.get("health_stamped")  # the kernel's stamps (load/bench/health.py), from stop 63
        lines.append(
            f"| {row['target']} | {row['round']} | {row['requests']} x {row['max_tokens']} | {served} | {refused} "
            f"| {other} | {r['p50']:.0f} | {r['p99']:.0f} | {r['max']:.0f} | {arrival} "
            f"| {f['p50']:.0f} | {f['p99']:.0f} | {d['max']:.0f} "
            f"| {h['p99']:.1f} | {h['max']:.1f} | {'-' if stamped is None else format(stamped['p99'], '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load.burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--target", action="append", default=[], metavar="NAME=URL")
    p.add_argument("--start", action="append", default=[], metavar="KIND[:CONFIG@APP]")
    p.add_argument("--requests", type=int, action="append", required=True, help="burst size; repeatable")
    p.add_argument("--max-tokens", type=int, action="append", required=True, help="per --requests")
    p.add_argument("--input-words", type=int, default=256)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--pause", type=float, default=10.0, help="seconds between bursts, for the server to drain")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a burst waits for its last answer")
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path)
    opts = p.parse_args(argv)
    if len(opts.requests) != len(opts.max_tokens):
        p.error("give one --max-tokens per --requests")
    return opts


async def run(urls: dict[str, str], opts: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    scenarios = list(zip(opts.requests, opts.max_tokens, strict=True))
    for round_ in range(opts.rounds):
        for i, (n, max_tokens) in enumerate(scenarios):
            # Prompts of their own for each burst (the same for every target): a burst that repeated an
            # earlier one's would find them in the engine's prefix cache and look cheaper than it is.
            seed = round_ * len(scenarios) + i
            for name, url in urls.items():
                if rows:
                    await asyncio.sleep(opts.pause)
                row = {"target": name, "round": round_, **await measure(url, n, max_tokens, opts, seed)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    urls = dict(t.split("=", 1) for t in opts.target)
    out_dir = (opts.out or Path("results/burst.json")).parent
    with targets.started(opts.start, out_dir / "burst-logs") as launched:
        rows = asyncio.run(run(urls | launched, opts))
    meta = run_meta("load.burst", None if argv is None else list(argv))
    result = {**meta, "kind": "burst", "label": opts.label, "rows": rows}
    print(markdown(result))
    save_result(opts.out, result)


if __name__ == "__main__":
    main()
