"""Redeliveries: a request is acknowledged only once the broker took its reply, and a
redelivery of a request this worker already answered is answered again, never run again.

A reply given up on (`publish_timeout_s` passed during a broker stall, or the connection
was lost while it waited for its PUBACK) leaves its request unacknowledged. Then:

- the reply went out on a connection still up (a stalled broker reads it when it
  resumes): its late PUBACK acknowledges the request;
- otherwise, or if that connection is lost first, the broker delivers the request again
  once the worker is back on its session (it reconnects both connections together), and
  the redelivery gets the kept reply, published again; the tool does not run again.

A redelivery is known without a request id: the broker resends an unacknowledged
PUBLISH with its Packet Identifier on the same session (MQTT 5 section 4.4), and does
not reuse that identifier while it is unacknowledged; so a delivery is named by its
Packet Identifier and the message itself (topic, payload digest, response topic,
Correlation Data). A request answered on a connection since lost (whose PUBACK could not
be sent) is kept too: its redelivery is only acknowledged.

Bounded: at most `bound` requests are kept (the oldest forgotten first: its redelivery
is then handled anew, as a repeat for the dedup store), none longer than `keep_s` (the
broker's session expiry), and none across a reconnect without a session (a clean
session loses its requests, and the broker may reuse their identifiers). The slot a
request ran in is free as soon as its handler ends; a stalled broker holds the requests,
not the worker, and the keepalive ends a connection that stays silent.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from toolbus.wire.messages import Door, Inbound, Outbound, Publisher, Unconfirmed
from toolbus.wire.untrusted import shown

log = logging.getLogger("toolbus.redeliveries")

_Key = tuple[int, str, bytes, str | None, bytes | None]


class Acknowledger(Protocol):
    """The request connection: acknowledges what arrived on it (False: it did not)."""

    def ack(self, message: Inbound) -> bool: ...


def _key(message: Inbound) -> _Key | None:
    if message.packet_id is None:  # QoS 0: never redelivered
        return None
    digest = hashlib.blake2b(message.payload, digest_size=16).digest()
    return (
        message.packet_id,
        message.topic,
        digest,
        message.response_topic,
        message.correlation_data,
    )


@dataclass
class _Held:
    """A request in the worker's hands, until it is acknowledged."""

    done: asyncio.Event = field(default_factory=asyncio.Event)  # its first handling ended
    owed: Outbound | None = None  # its reply, until the broker acknowledges one
    settled: bool = False  # answered: a redelivery takes `owed` (None: acknowledge only)
    kept_at: float = field(default_factory=time.monotonic)


class Redeliveries:
    """Answers each message, acknowledges it once answered, and keeps what a redelivery
    needs (see the module docstring).

    Args:
        handle: the pipeline: answers a message, returns its unacknowledged reply.
        publisher: sends a kept reply again.
        bound: the most requests kept for their redelivery.
        keep_s: how long one is kept (the session expiry; 0: clean sessions, none kept
            across a reconnect).
    """

    def __init__(
        self,
        handle: Door,
        publisher: Publisher,
        bound: int,
        keep_s: float,
    ) -> None:
        self._handle, self._publisher = handle, publisher
        self._conn: Acknowledger | None = None
        self._bound, self._keep_s = bound, keep_s
        self._held: dict[_Key, _Held] = {}  # oldest first
        self.replayed = 0  # redeliveries answered from a kept reply, nothing run

    def connected(self, conn: Acknowledger, resumed: bool = True) -> None:
        """The request connection now, on a session the broker kept (`resumed`: its
        CONNACK's Session Present) or not. Without one, what a connection received is
        not delivered again on the next one, and the broker numbers its deliveries anew:
        nothing is kept, not even a request still running, or a new request with its
        Packet Identifier and bytes would be taken for its redelivery and go unanswered."""
        self._conn = conn
        if not (self._keep_s and resumed):
            self._held = {}

    def _ack(self, message: Inbound) -> bool:
        """Acknowledge it on the connection it came from, if that one is live (False: it
        is not, and the broker delivers the request again)."""
        if (conn := self._conn) is None or not conn.ack(message):
            log.debug("answered a request from an earlier connection: the broker resends it")
            return False
        return True

    async def answer(self, message: Inbound) -> None:
        """Answer `message` (or, for a redelivery, its first answer), then acknowledge it
        once the broker has its reply. Cancelled (the worker stops) before answering, it
        leaves the message unacknowledged, for the broker to deliver again."""
        key = _key(message)
        held = self._held.get(key) if key is not None else None
        if held is not None:
            await self._again(message, key, held)
            return
        held = _Held()
        if key is not None:
            self._held[key] = held
        try:
            unconfirmed = await self._handle(message)
            self._settle(message, key, held, unconfirmed)
        finally:
            if not held.settled:
                self._forget(key, held)  # (only its own: a new session may hold another)
            held.done.set()

    async def _again(self, message: Inbound, key: _Key | None, held: _Held) -> None:
        """A redelivery: wait for the first handling, then answer as it did."""
        await held.done.wait()  # bounded by that handling's own deadline
        if not held.settled:  # it ended unanswered (stopping): handle this one anew
            await self.answer(message)
            return
        self.replayed += 1
        unconfirmed = None
        if held.owed is not None:
            log.info(
                "request on %s delivered again: its reply sent again, nothing run",
                shown(message.topic),
            )
            unconfirmed = await self._publisher.publish(held.owed)
        self._settle(message, key, held, unconfirmed)

    def _settle(
        self, message: Inbound, key: _Key | None, held: _Held, unconfirmed: Unconfirmed | None
    ) -> None:
        held.settled = True
        if unconfirmed is None:
            held.owed = None
            # Acknowledged, or answered on a connection since lost: then its redelivery
            # is only acknowledged (a session keeps it; a clean one has dropped it).
            if self._ack(message) or not self._keep_s:
                self._forget(key, held)
            else:
                self._bound_kept()
            return
        held.owed = unconfirmed.out
        log.warning(
            "reply to %s not acknowledged by the broker: its request is left "
            "unacknowledged, for its late PUBACK or its redelivery",
            shown(unconfirmed.out.topic),
        )
        if unconfirmed.late is not None:
            unconfirmed.late.add_done_callback(
                lambda late: self._late_puback(late, message, key, held)
            )
        elif not self._keep_s:  # no session: nothing comes again, and the reply is lost
            self._forget(key, held)
        self._bound_kept()

    def _late_puback(
        self, late: asyncio.Future[None], message: Inbound, key: _Key | None, held: _Held
    ) -> None:
        if late.cancelled() or late.exception() is not None:
            # Its connection was lost: the redelivery gets the reply again (a clean
            # session delivers nothing again: the reply is lost).
            if not self._keep_s:
                self._forget(key, held)
            return
        if held.owed is not None:  # (a redelivery may have sent it again meanwhile)
            held.owed = None
            if self._ack(message) or not self._keep_s:
                self._forget(key, held)

    def _forget(self, key: _Key | None, held: _Held) -> None:
        if key is not None and self._held.get(key) is held:
            del self._held[key]

    def _bound_kept(self) -> None:
        """At most `bound` settled requests, none older than `keep_s`."""
        now = time.monotonic()
        settled = [(k, h) for k, h in self._held.items() if h.settled]
        stale = [k for k, h in settled if self._keep_s and now - h.kept_at > self._keep_s]
        excess = max(0, len(settled) - len(stale) - self._bound)
        fresh = [k for k, _ in settled if k not in stale]
        for k in [*stale, *fresh[:excess]]:
            del self._held[k]
        if excess:
            log.warning(
                "%d unacknowledged requests forgotten (more than %d kept): a redelivery "
                "of them is handled as a new delivery",
                excess,
                self._bound,
            )
