"""Properties: an outgoing message's MQTT v5 PUBLISH properties, encoded directly.

paho's `Properties` builds its name and type tables afresh for every instance and
validates each assignment through them: for a reply's three or four properties that
cost more than the rest of the publish. A reply's properties are known at once, so they
are encoded here in one pass (MQTT v5 section 2.2.2: a variable byte integer length,
then identifier and value per property) and handed to paho as a `Properties` whose
`pack()` returns those bytes. paho's own encoding is the oracle in
tests/transport/test_transport.py: the same bytes for every property we set.
"""

from __future__ import annotations

import struct

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from toolbus.wire.messages import Outbound

# Property identifiers (MQTT v5 table 2-4), in the order paho packs them.
_MESSAGE_EXPIRY = b"\x02"  # four byte integer
_CONTENT_TYPE = b"\x03"  # UTF-8 string
_RESPONSE_TOPIC = b"\x08"  # UTF-8 string
_CORRELATION_DATA = b"\x09"  # binary data
_USER_PROPERTY = b"\x26"  # UTF-8 string pair
MAX_FIELD_BYTES = 65535  # a two-byte length prefix


class PackedProperties(Properties):
    """PUBLISH properties whose wire bytes are already encoded."""

    def __init__(self, packed: bytes) -> None:  # paho's tables are not built: not needed
        object.__setattr__(self, "packetType", PacketTypes.PUBLISH)
        object.__setattr__(self, "_packed", packed)

    def pack(self) -> bytes:
        packed: bytes = object.__getattribute__(self, "_packed")
        return packed

    def isEmpty(self) -> bool:  # noqa: N802 -- paho's name
        return self.pack() == b"\x00"

    def __str__(self) -> str:  # paho's debug log prints it
        return f"[{len(self.pack())} bytes of properties]"


def publish_properties(out: Outbound) -> PackedProperties:
    """`out`'s expiry, content type, response topic, correlation data and user properties."""
    parts: list[bytes] = []
    if out.expiry_s is not None:
        parts += (_MESSAGE_EXPIRY, struct.pack("!L", out.expiry_s))
    if out.content_type:
        parts += (_CONTENT_TYPE, _text(out.content_type))
    if out.response_topic:
        parts += (_RESPONSE_TOPIC, _text(out.response_topic))
    if out.correlation_data is not None:
        parts += (_CORRELATION_DATA, _binary(out.correlation_data))
    for key, value in out.user_properties:
        parts += (_USER_PROPERTY, _text(key), _text(value))
    body = b"".join(parts)
    return PackedProperties(varint(len(body)) + body)


def packet_bytes(out: Outbound, properties: bytes) -> int:
    """The size of `out`'s PUBLISH on the wire (MQTT v5 section 3.3): fixed header,
    topic, Packet Identifier (QoS > 0), properties, payload."""
    remaining = 2 + len(out.topic.encode("utf-8")) + (2 if out.qos else 0)
    remaining += len(properties) + len(out.payload)
    return 1 + len(varint(remaining)) + remaining


def _text(value: str) -> bytes:
    return _binary(value.encode("utf-8"))


def _binary(value: bytes) -> bytes:
    if len(value) > MAX_FIELD_BYTES:
        raise ValueError(f"a property of {len(value)} bytes exceeds MQTT's {MAX_FIELD_BYTES}")
    return struct.pack("!H", len(value)) + value


def varint(value: int) -> bytes:
    """MQTT's variable byte integer: seven bits a byte, the high bit set on all but the last."""
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | 0x80 if value else digit)
        if not value:
            return bytes(out)
