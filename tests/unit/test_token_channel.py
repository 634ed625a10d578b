"""serve_app/token_channel.py: chunks from llm replicas to an ingress's inbox over real local TCP."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from serve_app import token_channel
from serve_app.errors import ServiceUnavailableError
from serve_app.messages import ReplyTo
from serve_app.token_channel import Inbox, Outbox

unpickled: list[str] = []


class Canary:
    """Records it was unpickled: what a reader that unpickles a stranger's frame would do."""

    def __reduce__(self) -> tuple[Any, ...]:
        return unpickled.append, ("canary",)


async def test_the_chunks_sent_in_one_loop_turn_go_in_one_write_each_to_its_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inbox = Inbox("127.0.0.1")
    (first, first_arrivals), (second, second_arrivals) = [await inbox.open() for _ in range(2)]
    outbox = Outbox()
    connection = await outbox.connection(first)
    assert await outbox.connection(second) is connection  # one connection per inbox
    writes: list[Any] = []
    write = connection.writer.write

    def recorded(data: Any) -> None:
        writes.append(data)
        write(data)

    monkeypatch.setattr(connection.writer, "write", recorded)
    for chunk in ("a1", "a2"):
        connection.send(first.key, chunk)
    connection.send(second.key, "b1")
    assert [await first_arrivals.get() for _ in range(2)] == ["a1", "a2"]
    assert await second_arrivals.get() == "b1"
    assert len(writes) == 1
    connection.send(second.key, "b2")  # a later turn: a write of its own
    assert await second_arrivals.get() == "b2"
    assert len(writes) == 2
    outbox.close()


async def test_a_chunk_for_a_closed_stream_is_dropped() -> None:
    inbox = Inbox("127.0.0.1")
    (gone, gone_arrivals), (kept, kept_arrivals) = [await inbox.open() for _ in range(2)]
    inbox.close(gone.key)
    connection = await Outbox().connection(gone)
    connection.send(gone.key, "late")
    connection.send(kept.key, "on time")
    assert await kept_arrivals.get() == "on time"
    assert gone_arrivals.empty()
    assert (await inbox.open())[0].key not in (gone.key, kept.key)  # a key is never given twice


async def test_a_connection_without_the_secret_is_closed_unread() -> None:
    inbox = Inbox("127.0.0.1")
    to, _ = await inbox.open()
    reader, writer = await asyncio.open_connection(to.host, to.port)
    writer.write(token_channel._frame(b"x" * len(to.secret)))
    writer.write(token_channel._frame(pickle.dumps([(to.key, Canary())])))
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the inbox
    writer.close()
    assert unpickled == []


async def test_an_unreachable_inbox_is_a_503_naming_it() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ServiceUnavailableError, match=f"token inbox at 127.0.0.1:{port}"):
        await Outbox().connection(ReplyTo("127.0.0.1", port, b"s" * 16, 1))


async def test_a_connection_the_inbox_ended_fails_its_senders_and_is_opened_again() -> None:
    inbox = Inbox("127.0.0.1")
    to, arrivals = await inbox.open()
    outbox = Outbox()
    broken = await outbox.connection(to)
    broken.writer.write(token_channel._frame(b"not a pickle"))  # the inbox logs it and closes the connection
    async with asyncio.timeout(5):
        while not broken.broken:
            await asyncio.sleep(0.01)
    with pytest.raises(
        ServiceUnavailableError, match=f"lost its connection to the ingress's token inbox at 127.0.0.1:{to.port}"
    ):
        broken.send(to.key, "lost")
    connection = await outbox.connection(to)
    assert connection is not broken
    connection.send(to.key, "after")
    assert await arrivals.get() == "after"


async def test_a_connection_that_never_sends_the_secret_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_channel, "_HANDSHAKE_S", 0.05)
    to, _ = await Inbox("127.0.0.1").open()
    reader, writer = await asyncio.open_connection(to.host, to.port)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_sender_waits_while_its_reader_is_far_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_channel, "_HIGH_WATER", 0)
    inbox = Inbox("127.0.0.1")
    to, arrivals = await inbox.open()
    connection = await Outbox().connection(to)
    drained: list[bool] = []

    async def drain() -> None:
        drained.append(True)

    monkeypatch.setattr(connection.writer, "drain", drain)
    monkeypatch.setattr(connection.writer.transport, "get_write_buffer_size", lambda: 1)
    connection.send(to.key, "x")
    await connection.wait_for_reader()
    assert drained == [True]
    assert await arrivals.get() == "x"
