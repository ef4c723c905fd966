"""In flight: the messages being handled, at most `concurrency` at once.

A slot is taken before a message is: the consumer stops taking messages while every
slot is busy, and cancelling it at shutdown never drops a message the client already
acknowledged. Each message runs in its own named task; `finish` lets them run on
until a deadline and cancels the rest (each cancelled handler answers `unavailable`
on its way out).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from toolbus.observability.metrics import Metrics
from toolbus.wire.messages import Inbound

log = logging.getLogger("toolbus.service")


class Slots:
    """The worker's `count` slots: one per message; a message of many calls borrows the
    free ones so its calls run at once, without ever exceeding the bound."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._free = asyncio.BoundedSemaphore(count)  # giving back more than taken is a bug

    async def acquire(self) -> None:
        await self._free.acquire()

    def any_free(self) -> bool:
        return not self._free.locked()

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self._free.release()

    async def borrow(self, wanted: int) -> int:
        """Take up to `wanted` slots that are free now, without waiting; how many."""
        taken = 0
        while taken < wanted and not self._free.locked():
            await self._free.acquire()  # free: returns at once
            taken += 1
        return taken


class InFlight:
    """Slots, handler tasks and their counts. `handle` answers a message and acknowledges
    it once answered (see `redeliveries`)."""

    def __init__(
        self,
        handle: Callable[[Inbound], Awaitable[None]],
        slots: Slots,
        metrics: Metrics,
    ) -> None:
        self._handle_message, self._metrics = handle, metrics
        self._slots = slots
        self.concurrency = slots.count  # messages at once, at most
        self._tasks: set[asyncio.Task[None]] = set()
        self._sequence = 0
        self.count = self.max_count = self.handled = 0

    def __len__(self) -> int:
        return len(self._tasks)

    async def acquire(self) -> None:
        """Wait for a free slot; `start` or `release` must follow."""
        await self._slots.acquire()

    def any_free(self) -> bool:
        """A slot is free now: `acquire` returns at once."""
        return self._slots.any_free()

    def release(self) -> None:
        """Give back a slot taken for a message that never came."""
        self._slots.release()

    def start(self, message: Inbound) -> None:
        """Handle `message` in its own task, in the slot already acquired."""
        self.count += 1
        self.max_count = max(self.max_count, self.count)
        self._metrics.message_started()
        self._sequence += 1
        task = asyncio.create_task(self._run(message), name=f"handle:{self._sequence}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, message: Inbound) -> None:
        try:
            await self._handle_message(message)
        finally:
            self.handled += 1
            self.count -= 1
            self._metrics.message_done()
            self._slots.release()

    async def finish(self, deadline: float, answer_timeout_s: float) -> None:
        """Let running handlers finish until `deadline` (loop time); cancel the rest.

        Cancelled handlers get `answer_timeout_s` to publish their `unavailable`.
        """
        if not self._tasks:
            return
        remaining_s = max(0.0, deadline - asyncio.get_running_loop().time())
        _, late = await asyncio.wait(set(self._tasks), timeout=remaining_s)
        for task in late:
            task.cancel()
        if late:
            log.warning("%d calls did not finish within the grace period", len(late))
            await asyncio.wait(late, timeout=answer_timeout_s)
