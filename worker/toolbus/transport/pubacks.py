"""PUBACKs awaited: one future per QoS 1 publish of ours, resolved by its PUBACK.

A publish waits for its PUBACK within a bound, and learns its MQTT v5 reason code: 0x80
and above is the broker refusing to take the message (0x87: its ACL). Past the bound,
on a connection still up, the message was sent all the same (a stalled broker reads it
when it resumes): the wait ends with `Unacknowledged`, whose `late` future still
resolves on that PUBACK, or fails once the connection is lost without it. A lost
connection fails every wait at once: no PUBACK comes on it now.
"""

from __future__ import annotations

import asyncio
from typing import Any

from toolbus.transport.errors import TransportError, Unacknowledged


class Pubacks:
    """The PUBACKs one connection waits for, by message id; `len` counts the waits."""

    def __init__(self) -> None:
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._late: dict[int, asyncio.Future[None]] = {}  # given up on: may still come
        # PUBACKs read in the turn of the loop their wait's bound ran out in, before the
        # wait saw it: they came, and must not be waited for as `late` (never again).
        self._came: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self, mid: int, timeout_s: float) -> int:
        """The reason code of the PUBACK of `mid` when it comes; `Unacknowledged` past
        `timeout_s`; `TransportError` once the connection is lost."""
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[int] = loop.create_future()
        self._waiting[mid] = acked
        # A timer that fails the future, not `asyncio.timeout` (which cancels the task):
        # the same bound for a third of the steps, on every reply.
        timer = loop.call_later(timeout_s, _unacknowledged, acked)
        try:
            return await acked
        except Unacknowledged:
            if mid in self._came:
                return self._came[mid]  # acknowledged after all, just as the bound ran out
            late: asyncio.Future[None] = loop.create_future()
            late.add_done_callback(_retrieved)  # its holder may never look at its loss
            self._late[mid] = late
            raise Unacknowledged(late) from None
        finally:
            timer.cancel()
            self._waiting.pop(mid, None)
            self._came.pop(mid, None)

    def came(self, mid: int, reason_code: int = 0) -> None:
        """The PUBACK of `mid` came, with `reason_code` (a refusal is not retried here,
        since sending again would not help: `wait` returns it to the publisher)."""
        acked = self._waiting.pop(mid, None)
        if acked is not None:
            if not acked.done():
                acked.set_result(reason_code)
            else:  # its bound ran out, and `wait` has not seen it
                self._came[mid] = reason_code
        late = self._late.pop(mid, None)
        if late is not None and not late.done():
            late.set_result(None)

    def lost(self) -> None:
        """The connection is gone: no PUBACK comes on it now."""
        waiting, self._waiting = self._waiting, {}
        late, self._late = self._late, {}
        futures: list[asyncio.Future[Any]] = [*waiting.values(), *late.values()]
        for acked in futures:
            if not acked.done():
                acked.set_exception(
                    TransportError("connection lost before the broker acknowledged")
                )


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _unacknowledged(acked: asyncio.Future[int]) -> None:
    if not acked.done():
        # A placeholder: `wait` raises one carrying the late PUBACK's future.
        acked.set_exception(Unacknowledged(acked.get_loop().create_future()))
