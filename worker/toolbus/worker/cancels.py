"""Cancels in: every worker hears `{prefix}/cancel/#`, so the one running the call does.

Requests come on a shared subscription, so any worker of the pool may run a call; its
cancel comes on a plain one, on the worker's reply connection: the request connection
reads a message only once a slot is free (`InFlight`), and a cancel must reach a worker
whose slots are all busy, running the very call to cancel. What arrives is handed to
the pipeline (`Pipeline.cancel`) in its own task, at most `MAX_PENDING` at once: a flood
of cancels beyond that is dropped (and counted in the log), never queued without bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import Topics
from toolbus.worker.fleet import Fleet

log = logging.getLogger("toolbus.service")

MAX_PENDING = 256  # cancels being handled at once (each: a store write and a look)


class CancelIntake:
    """Routes what the reply connection receives: cancels to the pipeline, the rest
    (statuses, when the fleet is watched) to `fleet`."""

    def __init__(self, pipeline: Pipeline, topics: Topics, fleet: Fleet | None) -> None:
        self._pipeline, self._topics = pipeline, topics
        self._other: Callable[[Inbound], None] | None = fleet.received if fleet else None
        self._pending: set[asyncio.Task[bool]] = set()
        self.dropped = 0
        self.handled = 0  # cancels handled since start (what the tests wait for)
        self._handled = asyncio.Condition()

    def received(self, message: Inbound) -> None:
        if message.topic != self._topics.cancel and not message.topic.startswith(
            self._topics.cancel + "/"
        ):
            if self._other is not None:
                self._other(message)
            return
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            log.warning("too many cancels at once: one dropped (%d so far)", self.dropped)
            return
        task = asyncio.create_task(self._handle(message), name="cancel")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _handle(self, message: Inbound) -> bool:
        try:
            return await self._pipeline.cancel(message)
        finally:
            async with self._handled:
                self.handled += 1
                self._handled.notify_all()

    async def until_handled(self, count: int) -> None:
        """Once `count` cancels have been handled since start (unbounded: bound it)."""
        async with self._handled:
            await self._handled.wait_for(lambda: self.handled >= count)
