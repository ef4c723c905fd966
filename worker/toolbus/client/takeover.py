"""When the client connects again after its connection is lost, and when it gives up.

Another connection with our client id takes the session over: MQTT v5 DISCONNECT 0x8E,
or, from mosquitto before 2.0.15, a connection closed without a word soon after it was
made. Connecting again at once takes the session back, and the other does the same: a
loop of thousands a second. So a connection lost within `SHORT_LIVED_S` of being made,
or taken over, is made again only after a doubling delay (`TAKEN_OVER_DELAYS_S`); a
one-off command (`fail`) gives up instead.

The takeover can come before the connection is ready: between its CONNACK and the
SUBACK of its reply topic (two commands started at once with one client id). That loss
(`Dropped`) counts like any other short-lived connection, never as a broker that cannot
be reached.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from toolbus.transport import SessionTakenOver, TransportError

__all__ = ["SHORT_LIVED_S", "TAKEN_OVER_DELAYS_S", "Dropped", "Takeovers"]

log = logging.getLogger("toolbus.client")

# Doubling, bounded: two clients with one client id trade the session a few times a
# second at most.
TAKEN_OVER_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0)
# A connection lost sooner than this after it was made counts toward that backoff: a
# taken-over one that mosquitto before 2.0.15 closes without saying why.
SHORT_LIVED_S = 2.0


class Dropped(TransportError):
    """The connection was lost after its CONNACK, before its subscriptions were granted
    (`taken_over`: the broker said 0x8E). Never leaves the requester."""

    def __init__(self, cause: TransportError, *, taken_over: bool) -> None:
        super().__init__(str(cause))
        self.taken_over = taken_over


@dataclass(slots=True)
class Takeovers:
    """Connections in a row lost soon after they were made, for one client id.

    `fail`: the first takeover the broker names (0x8E), or the second short-lived
    connection in a row, fails the client (`SessionTakenOver`); else it connects again
    after the next delay.
    """

    client_id: str
    fail: bool
    short_lived: int = 0

    def after_loss(
        self, taken_over: bool, lived_s: float, *, fail_at: int | None = None
    ) -> float | SessionTakenOver:
        """The delay before connecting again (0: at once, a broker restart say), or the
        error that fails the client now. `fail_at`: give up on this many short-lived
        connections in a row even when not `fail` (a first connect that never holds)."""
        delay_s = self._delay(taken_over, lived_s, fail_at)
        if taken_over and not isinstance(delay_s, SessionTakenOver):
            log.warning(
                "another connection took client id %s over: connecting again in %g s (two "
                "clients with one client id take it from each other)",
                self.client_id,
                delay_s,
            )
        return delay_s

    def _delay(
        self, taken_over: bool, lived_s: float, fail_at: int | None
    ) -> float | SessionTakenOver:
        if not taken_over and lived_s >= SHORT_LIVED_S:
            self.short_lived = 0
            return 0.0
        self.short_lived += 1
        if (self.fail and (taken_over or self.short_lived >= 2)) or (
            fail_at is not None and self.short_lived >= fail_at
        ):
            return SessionTakenOver(self.client_id, certain=taken_over, times=self.short_lived)
        return TAKEN_OVER_DELAYS_S[min(self.short_lived, len(TAKEN_OVER_DELAYS_S)) - 1]
