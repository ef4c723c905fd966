"""PUBACKs awaited: one future per QoS 1 publish of ours, resolved by its PUBACK.

A publish waits for its PUBACK within a bound. Past it, on a connection still up, the
message was sent all the same (a stalled broker reads it when it resumes): the wait
ends with `Unacknowledged`, whose `late` future still resolves on that PUBACK, or fails
once the connection is lost without it. A lost connection fails every wait at once: no
PUBACK comes on it now.
"""

from __future__ import annotations

import asyncio

from toolbus.transport.errors import TransportError, Unacknowledged


class Pubacks:
    """The PUBACKs one connection waits for, by message id; `len` counts the waits."""

    def __init__(self) -> None:
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._late: dict[int, asyncio.Future[None]] = {}  # given up on: may still come
        # PUBACKs read in the turn of the loop their wait's bound ran out in, before the
        # wait saw it: they came, and must not be waited for as `late` (never again).
        self._came: set[int] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self, mid: int, timeout_s: float) -> None:
        """Returns on the PUBACK of `mid`; `Unacknowledged` past `timeout_s`;
        `TransportError` once the connection is lost."""
        loop = asyncio.get_running_loop()
        acked = loop.create_future()
        self._waiting[mid] = acked
        # A timer that fails the future, not `asyncio.timeout` (which cancels the task):
        # the same bound for a third of the steps, on every reply.
        timer = loop.call_later(timeout_s, _unacknowledged, acked)
        try:
            await acked
        except Unacknowledged:
            if mid in self._came:
                return  # acknowledged after all, just as the bound ran out
            late: asyncio.Future[None] = loop.create_future()
            late.add_done_callback(_retrieved)  # its holder may never look at its loss
            self._late[mid] = late
            raise Unacknowledged(late) from None
        finally:
            timer.cancel()
            self._waiting.pop(mid, None)
            self._came.discard(mid)

    def came(self, mid: int) -> None:
        """The PUBACK of `mid` came (any reason code: a refusal is not retried, since
        sending again would not help)."""
        for waiting in (self._waiting, self._late):
            acked = waiting.pop(mid, None)
            if acked is None:
                continue
            if not acked.done():
                acked.set_result(None)
            elif waiting is self._waiting:  # its bound ran out, and `wait` has not seen it
                self._came.add(mid)

    def lost(self) -> None:
        """The connection is gone: no PUBACK comes on it now."""
        waiting, self._waiting = self._waiting, {}
        late, self._late = self._late, {}
        for acked in (*waiting.values(), *late.values()):
            if not acked.done():
                acked.set_exception(
                    TransportError("connection lost before the broker acknowledged")
                )


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _unacknowledged(acked: asyncio.Future[None]) -> None:
    if not acked.done():
        # A placeholder: `wait` raises one carrying the late PUBACK's future.
        acked.set_exception(Unacknowledged(acked))
