"""The token channel: streamed chunks from llm replicas to an ingress replica, many streams a message.

Over a Serve streaming call every chunk is a message of its own, and each pays Serve's per-item work on
both ends (its generator wrappers, a gRPC frame, a wake-up of the reading task). Here the llm stage's
call stays a Serve call (routing, `max_ongoing_requests`, cancellation, errors, autoscaling all as
before) but answers only how many chunks it sent; the chunks go to the caller's `Inbox` over one TCP
connection per llm replica and ingress replica, and the chunks that are ready in the same turn of the
llm replica's event loop (one engine step's outputs, for every stream of that ingress) go in one write.
On a 2-core EPYC that cut the graph's CPU outside the engine by 13-24 % a streamed completion at concurrency
8 and 32 (docs/benchmarks-notes.md, stop 49).

Framing: a 4-byte big-endian length, then that many bytes. A connection's first frame is the inbox's
secret (random, 16 bytes, passed in each request's `ReplyTo` through Serve); nothing else from a
connection is read without it, since the rest are pickles (as Serve's own messages between replicas
are). Each later frame is a pickled list of `(key, chunk)`: `key` names the stream at the inbox.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import os
import pickle
import secrets
from typing import Any

from serve_app.errors import ServiceUnavailableError
from serve_app.messages import ReplyTo

logger = logging.getLogger("ray.serve")

_LENGTH = 4
# Above this many bytes not yet taken by the kernel, a sender waits until they are: the ingress's loop
# reads every connection eagerly, so this holds back an llm replica only when that loop falls behind.
_HIGH_WATER = 1 << 20
# A connection that has not sent the secret within this long is closed.
_HANDSHAKE_S = 5.0


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(_LENGTH, "big") + payload


class Inbox:
    """The ingress end: a TCP server whose connections carry chunks for the streams opened here."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._secret = secrets.token_bytes(16)
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        # Keys are never reused within a process, so a chunk that comes after its stream closed is dropped.
        self._keys = itertools.count(int.from_bytes(os.urandom(4), "big"))
        self._port: int | None = None
        self._starting = asyncio.Lock()

    async def open(self) -> tuple[ReplyTo, asyncio.Queue[Any]]:
        """A new stream: where its chunks are to be sent, and the queue they arrive in."""
        if self._port is None:
            async with self._starting:
                if self._port is None:
                    # Serves for the life of the process (the ingress replica's); the loop keeps it.
                    server = await asyncio.start_server(self._read, self._host, 0)
                    self._port = server.sockets[0].getsockname()[1]
        key = next(self._keys)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[key] = queue
        return ReplyTo(self._host, self._port, self._secret, key), queue

    def close(self, key: int) -> None:
        self._queues.pop(key, None)

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Ended, the connection closes, and its llm replica fails the calls that would send on it
        # (`_Connection.send`): their streams get that error as their call's answer.
        try:
            async with asyncio.timeout(_HANDSHAKE_S):
                length = int.from_bytes(await reader.readexactly(_LENGTH), "big")
                secret = await reader.readexactly(length) if length == len(self._secret) else b""
            if not hmac.compare_digest(secret, self._secret):
                logger.warning("token channel: a connection from %s without the secret, closed",
                               writer.get_extra_info("peername"))  # fmt: skip
                return
            queues = self._queues
            while True:
                length = int.from_bytes(await reader.readexactly(_LENGTH), "big")
                for key, chunk in pickle.loads(await reader.readexactly(length)):
                    queue = queues.get(key)
                    if queue is not None:
                        queue.put_nowait(chunk)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the llm replica closed it or went away
        except Exception:
            logger.exception("token channel: a connection from %s failed, closed", writer.get_extra_info("peername"))
        finally:
            writer.close()


class _Connection:
    """One llm replica's connection to one inbox; chunks sent in the same loop turn go in one frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str) -> None:
        self.writer = writer
        self._address = address
        self._pending: list[tuple[int, Any]] = []
        # The inbox never writes: the end of what it sends is the end of the connection (asyncio would
        # keep writing into a half-closed one, and the chunks would go nowhere).
        self._watch = asyncio.ensure_future(reader.read())
        self._watch.add_done_callback(self._ended)

    def _ended(self, watch: asyncio.Future[bytes]) -> None:
        if not watch.cancelled():
            watch.exception()  # a reset ends it as well as a close: read here, so that asyncio does not log it
        self.writer.close()

    @property
    def broken(self) -> bool:
        return self.writer.is_closing()

    def send(self, key: int, chunk: Any) -> None:
        """Sends `chunk` to stream `key` with the others sent this turn; ServiceUnavailableError once the
        connection has ended."""
        if self.broken:
            raise ServiceUnavailableError(f"The llm stage lost its connection to the ingress's token inbox at "
                                          f"{self._address}; retry.")  # fmt: skip
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append((key, chunk))

    def flush(self) -> None:
        """Writes what was sent this turn now (the connection's buffer takes it, or it is broken)."""
        if self._pending and not self.broken:
            batch, self._pending = self._pending, []
            self.writer.write(_frame(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)))

    def close(self) -> None:
        self.flush()  # what was sent this turn still goes
        self.writer.close()
        self._watch.cancel()

    async def wait_for_reader(self) -> None:
        if not self.broken and self.writer.transport.get_write_buffer_size() > _HIGH_WATER:
            await self.writer.drain()


class Outbox:
    """The llm replica's end: a connection per inbox, opened by the first stream to it."""

    def __init__(self) -> None:
        self._connections: dict[tuple[str, int], asyncio.Future[_Connection]] = {}

    async def connection(self, to: ReplyTo) -> _Connection:
        """The open connection to `to`'s inbox; ServiceUnavailableError if it cannot be reached."""
        address = (to.host, to.port)
        opening = self._connections.get(address)
        if opening is None or _broken(opening):
            # Connections to inboxes that went away (an ingress replica replaced) are dropped here.
            self._connections = {a: c for a, c in self._connections.items() if not _broken(c)}
            opening = self._connections[address] = asyncio.ensure_future(_open(to))
        try:
            # Shielded: a stream cancelled while the connection opens leaves it to the others.
            return await asyncio.shield(opening)
        except OSError as exc:
            raise ServiceUnavailableError(
                f"The llm stage cannot reach the ingress's token inbox at {to.host}:{to.port}: {exc}"
            ) from exc

    def close(self) -> None:
        for opening in self._connections.values():
            if opening.done() and not _broken(opening):
                opening.result().close()


def _broken(opening: asyncio.Future[_Connection]) -> bool:
    if not opening.done():
        return False
    return opening.cancelled() or opening.exception() is not None or opening.result().broken


async def _open(to: ReplyTo) -> _Connection:
    reader, writer = await asyncio.open_connection(to.host, to.port)
    writer.write(_frame(to.secret))
    return _Connection(reader, writer, f"{to.host}:{to.port}")
