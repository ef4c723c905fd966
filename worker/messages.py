"""Messages: what arrives and what leaves, as plain values.

The transport turns aiomqtt's messages into `Inbound` values and publishes
`Outbound` values with their MQTT v5 properties; everything between sees only these,
so the pipeline runs (and is tested) without a broker or paho objects.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

JSON = "application/json"


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
    received_at: float = field(default_factory=time.monotonic, compare=False)
    # Which delivery of which connection this is: the transport acknowledges it with this
    # token once the message is answered, and only on the connection it came from.
    delivery: object = field(default=None, compare=False, repr=False)
    # The broker's Packet Identifier of a QoS 1 delivery: kept by a redelivery on the same
    # session (MQTT 5 section 4.4), and not reused while the request is unacknowledged.
    packet_id: int | None = None


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


@dataclass(frozen=True, slots=True)
class Unconfirmed:
    """A publish given up on before the broker acknowledged it: the message may be lost.

    `late` is its PUBACK, should it still come: the message went out on a connection
    still up (a stalled broker reads it when it resumes); it fails once that connection
    is lost without it. None: never sent, or its connection was lost.
    """

    out: Outbound
    late: asyncio.Future[None] | None = None
