"""Inbound limits: how large a packet the broker may send us, and how many user
properties paho is given to parse.

Two costs one caller could otherwise put on every caller of a worker:

- Size. MQTT v5 Maximum Packet Size, sent on CONNECT (`connect_properties`), makes the
  broker drop a message larger than that for this client instead of sending it
  (MQTT v5 section 3.1.2.11.4; mosquitto honours it): a flood of 100 MB requests never
  reaches the worker's memory.
- Parsing. paho decodes a PUBLISH's properties in time quadratic in their number: each
  property re-slices the rest of the packet, payload included, and each user property
  copies the list of those before it. 11 000 empty user properties in 64 KiB, a size
  any packet bound lets through, cost 1.3 s of the event loop (every caller waits).
  So before paho decodes a PUBLISH, `PropertyGuard` walks its property block once, in
  place, up to the first user property past `MAX_USER_PROPERTIES` or
  `MAX_USER_PROPERTY_BYTES`: there it stops (the message is refused whatever follows),
  hands paho the packet without its user properties and without what followed that one,
  and the message says how many it read (`Inbound.dropped_user_properties`, at least
  that many), so the pipeline refuses it with the Response Topic and Correlation Data
  that came before (paho and most clients write them first). A hostile packet costs
  the walk over 65 properties, however many it holds.

paho has no hook before it decodes a PUBLISH: the guard wraps its `_handle_publish`
and reads its `_in_packet` (paho 2.x), and fails loudly at connect if they change. Its
`on_message` is also the one place that sees paho's message whole: it carries the DUP
flag, which aiomqtt's `Message` drops, to `_inbound` beside the tally. `delivery_id`
names a delivery as the broker's resend of it on the same session names it again.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from toolbus.transport.properties import varint
from toolbus.wire.messages import MAX_USER_PROPERTIES, MAX_USER_PROPERTY_BYTES, UserPropertyTally

# What a request packet holds besides its payload: the fixed header (5 bytes), the topic
# and the Response Topic (each up to MQTT's 64 KiB string, in practice under 1 KiB),
# Correlation Data (echoed up to 1 KiB), user properties (up to MAX_USER_PROPERTY_BYTES,
# 16 KiB), expiry, content type. 64 KiB covers every request the worker would answer,
# so a payload just over `max_payload_bytes` still reaches it and is refused with
# `bad_request`, not dropped by the broker without a word.
PACKET_HEADROOM_BYTES = 64 * 1024
# Attribute of a paho `Properties` that carries a `UserPropertyTally` to `_inbound`.
DROPPED_ATTRIBUTE = "_toolbus_dropped_user_properties"
# Attribute of a paho `Properties` set (True) on a message the broker delivered again.
DUP_ATTRIBUTE = "_toolbus_dup"
_MQTT_MAX_PACKET_BYTES = 268_435_455  # a four-byte variable byte integer (MQTT v5 1.5.5)
_USER_PROPERTY = 0x26
# Value sizes of the PUBLISH-relevant fixed-size property types (MQTT v5 table 2-4).
_FIXED = {0x01: 1, 0x02: 4, 0x23: 2}
_PREFIXED = frozenset({0x03, 0x08, 0x09})  # content type, response topic, correlation data
_SUBSCRIPTION_ID = 0x0B  # a variable byte integer
# A block this short cannot exceed either bound (a user property takes 5 bytes at least).
_NOTHING_TO_COUNT = 5 * MAX_USER_PROPERTIES


def max_packet_bytes(max_payload_bytes: int) -> int:
    """The Maximum Packet Size a worker asks for: the payload bound plus the headroom,
    at most MQTT's own limit (a larger value would be refused by paho at connect)."""
    return min(max_payload_bytes + PACKET_HEADROOM_BYTES, _MQTT_MAX_PACKET_BYTES)


def connect_properties(
    receive_maximum: int | None, session_expiry_s: int, max_packet: int | None
) -> Properties:
    """The CONNECT properties: Receive Maximum, Session Expiry, Maximum Packet Size."""
    connect = Properties(PacketTypes.CONNECT)
    if receive_maximum is not None:
        connect.ReceiveMaximum = receive_maximum
    if session_expiry_s:
        connect.SessionExpiryInterval = session_expiry_s
    if max_packet is not None:
        connect.MaximumPacketSize = max_packet
    return connect


class PropertyGuard:
    """Removes a PUBLISH's user properties before paho parses them, when over the bounds."""

    def __init__(self, client: paho.Client) -> None:
        handle = getattr(client, "_handle_publish", None)
        received = client.on_message
        if not callable(handle) or not isinstance(getattr(client, "_in_packet", None), dict):
            raise TypeError("paho no longer decodes a PUBLISH in _handle_publish(_in_packet)")
        if received is None:  # aiomqtt changed: never guess
            raise TypeError("aiomqtt no longer sets paho's on_message")
        self._paho, self._received = client, received
        self._handle: Callable[[], MQTTErrorCode] = handle
        self._dropped: UserPropertyTally | None = None
        self.dropped = 0  # messages whose user properties were removed
        client._handle_publish = self._handle_publish  # type: ignore[method-assign]
        client.on_message = self._on_message

    def _handle_publish(self) -> MQTTErrorCode:
        in_packet = self._paho._in_packet  # see the module docstring
        stripped = strip_user_properties(in_packet["command"], in_packet["packet"])
        if stripped is None:
            return self._handle()
        in_packet["packet"], self._dropped = stripped
        self.dropped += 1
        try:
            return self._handle()  # calls on_message, which marks the message
        finally:
            self._dropped = None

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        if self._dropped is not None and message.properties is not None:
            object.__setattr__(message.properties, DROPPED_ATTRIBUTE, self._dropped)
        # A v5 connection always has properties; without them a redelivery reads as a
        # new delivery (a provider's id runs again rather than replay another's answer).
        if message.dup and message.properties is not None:
            object.__setattr__(message.properties, DUP_ATTRIBUTE, True)
        self._received(client, userdata, message)


def delivery_id(client_id: str, packet_id: int) -> str:
    """One delivery to one MQTT session: a resend on the session keeps its packet id
    (MQTT 5 section 4.4), a new publish gets the session's next. The client id is a
    digest: the worker's is a secret (`client_ids`), and the name goes into the store."""
    return f"{_session_of(client_id)}:{packet_id}"


@functools.lru_cache(maxsize=64)
def _session_of(client_id: str) -> str:
    return hashlib.sha256(client_id.encode()).hexdigest()[:16]


def strip_user_properties(
    command: int, packet: bytes | bytearray
) -> tuple[bytearray, UserPropertyTally] | None:
    """`packet` (a PUBLISH after its fixed header) without its user properties, and what
    of them was read, when they exceed the bounds; None when they do not, or when the
    packet is malformed (paho then refuses it itself).

    The walk stops at the first user property past a bound: the tally counts up to it
    (at most `MAX_USER_PROPERTIES + 1` of them, or `MAX_USER_PROPERTY_BYTES` and the one
    more), and every property after it is dropped unread, so a packet of 50 000 costs
    what one of 65 does. A Response Topic or Correlation Data sent after that point is
    dropped with them: paho, like most clients, writes them before the user properties."""
    view = memoryview(packet)
    at = 2 + int.from_bytes(view[0:2], "big") + (2 if command & 0x06 else 0)
    length, start = _varint(view, at)
    end = start + length
    if length <= _NOTHING_TO_COUNT or end > len(view):
        return None
    kept = bytearray()
    count = size = 0
    i = start
    try:
        while i < end:  # one pass, no copies: a user property costs a few operations
            ident = view[i]
            if ident == _USER_PROPERTY:
                j = i + 3 + (view[i + 1] << 8 | view[i + 2])  # past the key
                j += 2 + (view[j] << 8 | view[j + 1])  # past the value
                count += 1
                size += j - i
                i = j
                if count > MAX_USER_PROPERTIES or size > MAX_USER_PROPERTY_BYTES:
                    break  # refused whatever follows: the rest is never read
                continue
            if ident in _FIXED:
                j = i + 1 + _FIXED[ident]
            elif ident in _PREFIXED:
                j = i + 3 + (view[i + 1] << 8 | view[i + 2])
            elif ident == _SUBSCRIPTION_ID:
                j = _varint(view, i + 1)[1]
            else:
                return None  # not a PUBLISH property: paho says so
            kept += view[i:j]
            i = j
    except IndexError:  # a length past the packet's end: malformed, paho says so
        return None
    if i > end or (count <= MAX_USER_PROPERTIES and size <= MAX_USER_PROPERTY_BYTES):
        return None  # past the block's end (malformed, paho says so), or within the bounds
    rebuilt = bytearray(view[:at])
    rebuilt += varint(len(kept)) + kept
    rebuilt += view[end:]
    return rebuilt, UserPropertyTally(count, size)


def _varint(view: memoryview, at: int) -> tuple[int, int]:
    """MQTT's variable byte integer at `at`: its value and where it ends."""
    value = shift = 0
    for i in range(at, min(at + 4, len(view))):
        value |= (view[i] & 0x7F) << shift
        if not view[i] & 0x80:
            return value, i + 1
        shift += 7
    return 0, len(view) + 1  # malformed: past the end, so the caller leaves it to paho
