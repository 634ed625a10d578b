"""Fake Serve deployment handles for the tests of deployments/handles.py: calls that fail, hang, run in this
process, or record; and an llm replica's `generate_to` over the token channel."""

from __future__ import annotations

import asyncio
from typing import Any

from serve_app.messages import GenerateRequest, ReplyTo
from serve_app.token_channel import Outbox


class FailingHandle:
    """A DeploymentHandle whose every method call raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, method: str) -> Any:
        return self

    async def _raise(self) -> None:
        raise self.error

    def remote(self, *args: Any) -> Any:
        return self._raise()


class RaisingStreamHandle:
    """A DeploymentHandle (also as its `options()`) whose every call raises `error` at once."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def options(self, **_: Any) -> RaisingStreamHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        return self

    def remote(self, *args: Any) -> Any:
        raise self.error


class Pending:
    """A Serve response that never completes; records whether it was cancelled (in `cancel_called`, as
    the fakes below: Serve's streaming response has a `cancelled()` method of its own)."""

    def __init__(self) -> None:
        self.cancel_called = False

    def __await__(self) -> Any:
        return asyncio.sleep(3600).__await__()

    def cancel(self) -> None:
        self.cancel_called = True


class PendingHandle:
    def __init__(self, response: Any) -> None:
        self.response = response

    def __getattr__(self, method: str) -> Any:
        return self

    def options(self, **_: Any) -> PendingHandle:
        return self

    def remote(self, *args: Any) -> Any:
        return self.response


class InProcessHandle:
    """A DeploymentHandle whose calls run the deployment's class in this process."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica

    def __getattr__(self, method: str) -> Any:
        return InProcessMethod(getattr(self.replica, method))

    def options(self, **_: Any) -> InProcessHandle:
        return self


class InProcessMethod:
    def __init__(self, method: Any) -> None:
        self.method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.method(*args, **kwargs)  # a coroutine: awaitable as a Serve response is


class ChannelReplica:
    """An llm replica's `generate_to`: sends what the test puts in `chunks` over the token channel, until
    None; then answers how many it sent, or `answer` if set, or raises `error`. With `last_after_answer`, the
    last chunk leaves after the answer (or the error)."""

    def __init__(
        self, answer: int | None = None, last_after_answer: bool = False, error: BaseException | None = None
    ) -> None:
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.outbox = Outbox()
        self.answer = answer
        self.last_after_answer = last_after_answer
        self.error = error

    async def generate_to(self, request: GenerateRequest, reply_to: ReplyTo) -> int:
        connection = await self.outbox.connection(reply_to)
        sent, held = 0, None
        while (chunk := await self.chunks.get()) is not None:
            sent += 1
            if held is not None:
                connection.send(reply_to.key, held)
            held = chunk
            if not self.last_after_answer:
                connection.send(reply_to.key, held)
                held = None
        if held is not None:
            asyncio.get_running_loop().call_later(0.05, connection.send, reply_to.key, held)
        elif self.error is not None:
            await asyncio.sleep(0.05)  # the chunks before it are in by then
        if self.error is not None:
            raise self.error
        return sent if self.answer is None else self.answer


class RecordingHandle:
    """`generate_to` runs `stream`'s (a `ChannelReplica`); `tokenize` answers when the test resolves its future
    in `pending`; any other method is recorded in `calls` and answers None."""

    def __init__(self, stream: ChannelReplica | None = None) -> None:
        self.stream = stream
        self.pending: list[asyncio.Future[Any]] = []
        self.calls: list[str] = []

    def options(self, **_: Any) -> RecordingHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        return RecordedMethod(self, method)


class RecordedMethod:
    def __init__(self, handle: RecordingHandle, method: str) -> None:
        self.handle, self.method = handle, method

    def remote(self, *args: Any) -> Any:
        if self.method == "generate_to":
            assert self.handle.stream is not None
            return self.handle.stream.generate_to(*args)
        if self.method == "tokenize":
            self.handle.pending.append(asyncio.get_running_loop().create_future())
            return self.handle.pending[-1]
        self.handle.calls.append(self.method)
        return asyncio.sleep(0)
