"""Raw MQTT v5 PUBLISH properties for attackers: as many user properties as a test asks.

paho's own `Properties` appends each user property by copying the list before it, and
packs them by growing one bytes object: tens of thousands cost the sender seconds. An
attacker writes the bytes itself (MQTT v5 section 2.2.2) and hands paho a `Properties`
whose `pack()` returns them. Tests use it to play the caller, so it does not lean on
the worker's transport.
"""

from __future__ import annotations

import struct

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from toolbus.transport.properties import varint

RESPONSE_TOPIC, CORRELATION_DATA, USER_PROPERTY = 0x08, 0x09, 0x26


class RawProperties(Properties):
    """PUBLISH properties already encoded."""

    def __init__(self, packed: bytes) -> None:
        object.__setattr__(self, "packetType", PacketTypes.PUBLISH)
        object.__setattr__(self, "_packed", packed)

    def pack(self) -> bytes:
        packed: bytes = object.__getattribute__(self, "_packed")
        return packed

    def isEmpty(self) -> bool:  # noqa: N802 -- paho's name
        return False

    def __str__(self) -> str:  # paho's debug log prints it
        return f"[{len(self.pack())} bytes of properties]"


def properties(
    *,
    response_topic: str,
    correlation: bytes,
    user_properties: int = 0,
    key: bytes = b"k",
    value: bytes = b"",
    correlation_last: bool = False,
) -> RawProperties:
    """A Response Topic, Correlation Data, then `user_properties` copies of (key, value),
    in the order paho writes them; `correlation_last`: Correlation Data after the user
    properties (MQTT allows any order; paho never writes this one)."""
    pair = bytes([USER_PROPERTY]) + _field(key) + _field(value)
    correlation_data = bytes([CORRELATION_DATA]) + _field(correlation)
    body = bytes([RESPONSE_TOPIC]) + _field(response_topic.encode())
    if correlation_last:
        body += pair * user_properties + correlation_data
    else:
        body += correlation_data + pair * user_properties
    return RawProperties(varint(len(body)) + body)


def _field(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data
