"""Messages: what arrives and what leaves, as plain values.

The transport turns aiomqtt's messages into `Inbound` values and publishes
`Outbound` values with their MQTT v5 properties; everything between sees only these,
so the pipeline runs (and is tested) without a broker or paho objects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

JSON = "application/json"

# The MQTT v5 user properties a request may carry: how many, and their bytes on the wire
# (5 bytes of framing each, plus key and value). Room for W3C trace context (traceparent,
# tracestate, baggage up to 8 KiB) and a caller's own tags; a request with more is
# refused, and the transport removes them before paho parses them (paho's parse is
# quadratic in their number: see `transport.inbound_limits`).
MAX_USER_PROPERTIES = 64
MAX_USER_PROPERTY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class UserPropertyTally:
    """How many user properties a message carried, and their bytes on the wire, counted up
    to the first one past a bound (the count stops there: a message over a bound holds at
    least this many)."""

    count: int
    size_bytes: int

    @classmethod
    def of(cls, pairs: tuple[tuple[str, str], ...]) -> UserPropertyTally:
        count = size = 0
        for key, value in pairs:
            count += 1
            size += 5 + len(key.encode()) + len(value.encode())
            if count > MAX_USER_PROPERTIES or size > MAX_USER_PROPERTY_BYTES:
                break  # as the transport counts them (`transport.inbound_limits`)
        return cls(count, size)

    @property
    def over(self) -> bool:
        return self.count > MAX_USER_PROPERTIES or self.size_bytes > MAX_USER_PROPERTY_BYTES


@dataclass(frozen=True, slots=True)
class Inbound:
    """A message as received: topic, payload and the MQTT v5 properties we read."""

    topic: str
    payload: bytes
    qos: int = 1
    response_topic: str | None = None
    correlation_data: bytes | None = None
    content_type: str | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    # MQTT v5 Message Expiry Interval as handed over (the broker sends what remains), and
    # when the message arrived (time.monotonic()): together, when the sender stops caring.
    expiry_s: int | None = None
    retain: bool = False  # delivered as a retained message (a request never should be)
    # User properties beyond the bounds, removed unparsed by the transport (then
    # `user_properties` is empty): the request is refused.
    dropped_user_properties: UserPropertyTally | None = None
    received_at: float = field(default_factory=time.monotonic, compare=False)
    # Which delivery of which connection this is: the transport acknowledges it with this
    # token once the message is answered, and only on the connection it came from.
    delivery: object = field(default=None, compare=False, repr=False)
    # The broker's Packet Identifier of a QoS 1 delivery: kept by a redelivery on the same
    # session (MQTT 5 section 4.4), and not reused while the request is unacknowledged.
    packet_id: int | None = None
    # MQTT's DUP flag: the broker says it delivered this very message before (to this
    # session, which reconnected or restarted before acknowledging it); a new publish
    # never carries it.
    redelivered: bool = False
    # Which delivery this is, as a redelivery keeps it: the receiving MQTT session (a
    # digest of its client id, which is a secret) and the packet id, for QoS 1 and 2.
    # The broker numbers a session's deliveries up to 65535 and then from 1 again.
    delivery_id: str | None = None


@dataclass(frozen=True, slots=True)
class Outbound:
    """A message to publish, with the properties to set on it."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    correlation_data: bytes | None = None
    response_topic: str | None = None
    content_type: str | None = JSON
    user_properties: tuple[tuple[str, str], ...] = field(default=())
    expiry_s: int | None = None  # MQTT v5 Message Expiry Interval


class TooLarge(ValueError):
    """A message larger than the broker's Maximum Packet Size (its CONNACK): the broker
    would drop the connection that sent it, with every reply in flight on it."""


@dataclass(frozen=True, slots=True)
class Unconfirmed:
    """A publish given up on before the broker acknowledged it: the message may be lost.

    `late` is its PUBACK, should it still come: the message went out on a connection
    still up (a stalled broker reads it when it resumes); it fails once that connection
    is lost without it. None: never sent, or its connection was lost.
    """

    out: Outbound
    late: asyncio.Future[None] | None = None


class Publisher(Protocol):
    """Where the pipeline's messages go. A lost message is logged there, and returned
    (`Unconfirmed`) when the broker did not acknowledge it in time; the one exception
    is `TooLarge` (the broker would refuse it), answered like a reply not encoded."""

    async def publish(self, out: Outbound) -> Unconfirmed | None: ...


class Door(Protocol):
    """A front door's entry point: one message in, answered (replied, dead-lettered);
    returns the reply the broker did not acknowledge, if any (`Pipeline.handle`)."""

    def __call__(self, message: Inbound, /) -> Awaitable[Unconfirmed | None]: ...
