"""Progress: one call's updates to its caller's reply topic, in order, before its reply.

A `ProgressStream` is the envelope door's `ProgressSink` for one call that asked for
progress. Its sink is synchronous and never blocks or raises (an MCP SDK callback or a
local tool calls it from wherever it runs): it stamps the update and queues it. One task
per stream, named, publishes the queue in order. The pipeline `close`s the stream before
it publishes the reply, which waits for the queue to drain: progress never arrives after
the result. Every wait is bounded: a slow broker must not hold the call.

Rate limit (per call, `progress_rate_per_s`): an update that comes sooner than the
rate allows is held, and replaced by the next one (intermediates drop); a held update
goes out when the rate allows, and at the latest when the call ends: the last update
before the reply is never dropped. The queue is bounded too: full, its newest entry is
replaced (again an intermediate), so a stalled publish cannot grow it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import NamedTuple

from toolbus.calls.call import ReplyAddress
from toolbus.wire.contracts import Progress
from toolbus.wire.messages import Outbound, Publisher

log = logging.getLogger("toolbus.progress")

QUEUE_BOUND = 64  # updates waiting to be published, per call
FLUSH_S = 2.0  # the most the reply waits for a call's progress to go out
# An update's message is a status line: an MCP server's longer text is cut, so a queue of
# a call's updates holds kilobytes, never a server's megabytes.
MAX_MESSAGE_CHARS = 1024


class Update(NamedTuple):
    progress: float
    total: float | None
    message: str | None


class ProgressStream:
    """One call's progress, published to `address` under the call's `ident`.

    Args:
        publisher: where the updates go (the reply's own connection: same order).
        address: the caller's reply topic and correlation data.
        ident: the call's id (each call's own, in a message of many calls).
        rate_per_s: the most updates per second (0: no limit).
        flush_s: how long `close` waits for the queue to drain.
    """

    def __init__(
        self,
        publisher: Publisher,
        address: ReplyAddress,
        ident: str,
        *,
        rate_per_s: float,
        flush_s: float = FLUSH_S,
        bound: int = QUEUE_BOUND,
    ) -> None:
        self._publisher = publisher
        self._address = address
        self._ident = ident
        self._interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        self._flush_s = flush_s
        self._queue: deque[Update] = deque()
        self._bound = bound
        self._held: Update | None = None  # came too soon: sent when the rate allows
        self._next_at = -math.inf  # when the rate allows the next update
        self._wake = asyncio.Event()
        self._closed = False
        self.sent = 0
        self.dropped = 0
        self._task = asyncio.get_running_loop().create_task(
            self._publish_all(), name=f"toolbus-progress-{ident}"
        )

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        """Queue one update: synchronous, never blocking, never raising."""
        if self._closed:
            return  # after the call ended (an MCP notification late): the reply is out
        if message is not None and len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        update = Update(progress, total, message)
        now = time.monotonic()
        if now < self._next_at:
            if self._held is not None:
                self.dropped += 1
            self._held = update
        else:
            self._next_at = now + self._interval
            if self._held is not None:  # superseded by a newer one, now allowed
                self.dropped += 1
                self._held = None
            self._enqueue(update)
        self._wake.set()

    def _enqueue(self, update: Update) -> None:
        if len(self._queue) >= self._bound:
            self._queue.pop()  # the newest waiting one is an intermediate now
            self.dropped += 1
        self._queue.append(update)

    async def close(self) -> None:
        """The call has ended: publish what is held and queued, within `flush_s`, then
        stop. Called before the reply is published; never raises."""
        if self._closed:
            return
        self._closed = True
        if self._held is not None:  # the last update is never dropped
            self._enqueue(self._held)
            self._held = None
        self._wake.set()
        try:
            async with asyncio.timeout(self._flush_s):
                await asyncio.shield(self._task)
        except TimeoutError:
            self.dropped += len(self._queue)
            log.warning("progress of %s not flushed within %g s", self._ident, self._flush_s)
        except Exception:
            log.exception("progress of %s failed", self._ident)
        finally:
            self._task.cancel()

    async def _publish_all(self) -> None:
        """Publish the queue in order; a held update once the rate allows it."""
        while True:
            while self._queue:
                await self._publish(self._queue.popleft())
            if self._closed:
                return
            self._wake.clear()
            if self._held is not None:
                wait_s = self._next_at - time.monotonic()
                if wait_s <= 0:
                    self._next_at = time.monotonic() + self._interval
                    self._enqueue(self._held)
                    self._held = None
                    continue
                try:
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            await self._wake.wait()

    async def _publish(self, update: Update) -> None:
        body = Progress(
            id=self._ident, progress=update.progress, total=update.total, message=update.message
        )
        try:
            await self._publisher.publish(
                Outbound(
                    topic=self._address.topic,
                    payload=body.model_dump_json().encode(),
                    correlation_data=self._address.correlation_data,
                    expiry_s=_expiry_s(self._address),
                )
            )
            self.sent += 1
        except Exception as exc:  # a lost update is not the call's failure
            self.dropped += 1
            log.warning("could not publish progress of %s: %s", self._ident, exc)


def _expiry_s(address: ReplyAddress) -> int | None:
    """An update outliving its caller's wait is worth nothing: it expires with it."""
    if address.expires_at is None:
        return None
    return min(0xFFFFFFFF, max(1, math.ceil(address.expires_at - time.monotonic())))
