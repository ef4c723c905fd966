"""A connection's received messages, read by its one reader without a task per message.

aiomqtt keeps what paho received in a queue of `queue_type` and reads it through an
iterator that, for every message, makes a task for `queue.get()` and races it against
the disconnect in `asyncio.wait`: a task, two futures and a turn of the loop more per
request, the largest piece of the "inbound queue" stage in bench/README.md's profile.
`Inbox` is the queue aiomqtt fills (`put_nowait`, `qsize`, `get`: what it calls), and
`MqttConnection.messages` reads it with `next`, which waits on one future and ends
as soon as the connection is gone (`close`), as aiomqtt's iterator did: what is still
queued then was never acknowledged, so the broker delivers it again to whoever holds
the session next. Run here as well, a call without an id could run twice (a worker
whose session another process took over).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """Messages in arrival order for one reader; unbounded (the socket reader's `hold`
    stops reading the socket instead, `socket_reader.BoundedReader`)."""

    def __init__(self, maxsize: int = 0) -> None:
        del maxsize  # aiomqtt passes its bound (0: none); the reader bounds reading instead
        self._items: deque[T] = deque()
        self._waiters: list[asyncio.Future[None]] = []  # one a reader: a cancel is its own
        self._closed = False
        self.cause: BaseException | None = None  # why it ended, when `ends_with` said

    def ends_with(self, ended: asyncio.Future[None]) -> None:
        """Closed once `ended` is done too (aiomqtt's own end of its stream: a socket
        callback that failed, which paho's on_disconnect never hears), its error kept
        as `cause` (retrieved, so asyncio never logs it as unretrieved)."""
        ended.add_done_callback(self._ended)

    def _ended(self, ended: asyncio.Future[None]) -> None:
        if not ended.cancelled():
            self.cause = ended.exception()
        self.close()

    def put_nowait(self, item: T) -> None:
        """aiomqtt's `on_message`: in the event loop's thread (paho runs in the loop)."""
        self._items.append(item)
        self._wake()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def close(self) -> None:
        """The connection is gone: `next` returns None from now on, whatever is queued."""
        self._closed = True
        self._wake()

    async def next(self) -> T | None:
        """The next message; None once closed (what is left is the broker's to resend)."""
        while not self._items:
            if self._closed:
                return None
            await self._wait()
        return None if self._closed else self._items.popleft()

    async def get(self) -> T:
        """aiomqtt's own iterator's read (the connections that read through it): waits
        for a message whatever happens to the connection, as `asyncio.Queue.get` does."""
        while not self._items:
            await self._wait()
        return self._items.popleft()

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
