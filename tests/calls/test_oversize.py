"""Oversize requests in-process: user properties over the bounds are refused with a code,
the transport removes them before paho parses them, and the shipped broker's packet
limit agrees with the worker's (issue 24.2). Through a broker: test_oversize_broker.py."""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt import _packet
from paho.mqtt.enums import MQTTProtocolVersion

from tests.calls.test_pipeline import REPLY, Rig, rig_for
from tests.support.harness import measured
from tests.support.packets import properties
from tests.support.tools import Probe
from toolbus.cli.bench import mosquitto as bench_broker
from toolbus.config import Settings
from toolbus.transport import max_packet_bytes
from toolbus.transport.inbound_limits import PACKET_HEADROOM_BYTES, strip_user_properties
from toolbus.transport.properties import varint
from toolbus.wire.messages import MAX_USER_PROPERTIES, MAX_USER_PROPERTY_BYTES, UserPropertyTally

ROOT = Path(__file__).parents[2]
QOS1 = 0x32  # a PUBLISH's first byte at QoS 1
ECHO = {"arguments": {"text": "hi"}}


def rig() -> Rig:
    return rig_for([], Probe())


async def refusal(rig: Rig, **inbound: Any) -> dict[str, Any]:
    await rig.request("echo", ECHO, **inbound)
    reply = rig.reply()
    assert not reply["ok"] and reply["error"]["code"] == "bad_request", reply
    details: dict[str, Any] = reply["error"]["details"]
    assert details["reason"] == "user_properties_too_large"
    assert details["limit_count"] == MAX_USER_PROPERTIES
    assert details["limit_bytes"] == MAX_USER_PROPERTY_BYTES
    return details


async def test_user_properties_over_the_bounds_are_refused_and_at_them_taken() -> None:
    r = rig()
    at_count = tuple((f"k{n}", "v") for n in range(MAX_USER_PROPERTIES))
    await r.request("echo", ECHO, user_properties=at_count)
    assert r.reply()["ok"]
    one_more = (*at_count, ("k", "v"))
    details = await refusal(r, user_properties=one_more)
    assert details["count"] == MAX_USER_PROPERTIES + 1
    # 5 bytes of framing each, plus key and value
    assert details["size_bytes"] == UserPropertyTally.of(one_more).size_bytes
    at_bytes = (("k", "v" * (MAX_USER_PROPERTY_BYTES - 6)),)
    await r.request("echo", ECHO, user_properties=at_bytes)
    assert r.reply()["ok"]
    details = await refusal(r, user_properties=(("k", "v" * (MAX_USER_PROPERTY_BYTES - 5)),))
    assert details == {**details, "count": 1, "size_bytes": MAX_USER_PROPERTY_BYTES + 1}


async def test_user_properties_are_counted_up_to_the_first_past_a_bound() -> None:
    """The details say what was counted before the count stopped: at least that many."""
    many = tuple((f"k{n}", "v") for n in range(1000))
    details = await refusal(rig(), user_properties=many)
    assert details == {**details, "count": MAX_USER_PROPERTIES + 1}
    assert details["size_bytes"] == UserPropertyTally.of(many[: MAX_USER_PROPERTIES + 1]).size_bytes


async def test_user_properties_the_transport_removed_are_refused_as_it_counted_them() -> None:
    r = rig()
    dropped = UserPropertyTally(count=60_000, size_bytes=300_000)
    details = await refusal(r, dropped_user_properties=dropped)
    assert details == {**details, "count": 60_000, "size_bytes": 300_000}
    assert r.sent.on(REPLY) == []  # one answer, taken by `reply`


def publish_packet(props: bytes, payload: bytes, topic: bytes = b"tb/call/echo") -> bytearray:
    """A PUBLISH after its fixed header: topic, packet id 7, properties, payload."""
    return bytearray(struct.pack("!H", len(topic)) + topic + b"\x00\x07" + props + payload)


def counted(count: int, value: bytes) -> UserPropertyTally:
    """What the guard counts of `count` properties (key `k`, `value`): up to and with the
    first past a bound."""
    each = 5 + 1 + len(value)
    read = 0
    while read < count:
        read += 1
        if read > MAX_USER_PROPERTIES or read * each > MAX_USER_PROPERTY_BYTES:
            break
    return UserPropertyTally(read, read * each)


def decoded(packet: bytearray) -> tuple[_packet.PublishPacket, dict[str, Any]]:
    """paho's decoding of the packet, and the properties it read (by name)."""
    publish = _packet.decode_publish(QOS1, packet, MQTTProtocolVersion.MQTTv5)
    assert publish.properties is not None
    return publish, vars(publish.properties)


@pytest.mark.parametrize(
    ("count", "value", "stripped"),
    [
        (MAX_USER_PROPERTIES, b"", False),
        (MAX_USER_PROPERTIES + 1, b"", True),
        (1, b"v" * (MAX_USER_PROPERTY_BYTES - 6), False),
        (1, b"v" * (MAX_USER_PROPERTY_BYTES - 5), True),
        (20_000, b"vv", True),
    ],
)
def test_the_transport_removes_user_properties_over_the_bounds_and_keeps_the_rest(
    count: int, value: bytes, stripped: bool
) -> None:
    packed = properties(
        response_topic=REPLY, correlation=b"corr", user_properties=count, key=b"k", value=value
    ).pack()
    packet = publish_packet(packed, b'{"x": 1}')
    result = strip_user_properties(QOS1, packet)
    if not stripped:
        assert result is None
        return
    assert result is not None
    rebuilt, tally = result
    assert tally == counted(count, value)
    # paho's own decoding is the oracle: everything but the user properties is kept
    (original, _), (kept, props) = decoded(packet), decoded(rebuilt)
    assert (kept.topic, kept.mid, kept.payload) == (original.topic, original.mid, b'{"x": 1}')
    assert props["ResponseTopic"] == REPLY
    assert props["CorrelationData"] == b"corr"
    assert "UserProperty" not in props


@pytest.mark.parametrize(
    ("count", "value"),
    [
        (MAX_USER_PROPERTIES + 1, b""),
        (40_000, b""),  # 240 KB: within the worker's packet bound (320 KiB by default)
        (2, b"v" * (MAX_USER_PROPERTY_BYTES // 2)),  # past the byte bound at the second
        (100, b"v" * (MAX_USER_PROPERTY_BYTES // 2)),  # 800 KB, read: 2 of them
    ],
)
def test_the_guard_reads_no_further_than_the_first_property_past_a_bound(
    count: int, value: bytes
) -> None:
    """The guard's work, counted in user properties read, is bounded: 65 at most, however
    many the packet holds; and what follows the first past a bound is never read, so a
    malformed tail there is refused with the rest (paho never sees it)."""
    packed = properties(
        response_topic=REPLY, correlation=b"corr", user_properties=count, value=value
    ).pack()
    bound = counted(count, value)
    assert bound.count <= MAX_USER_PROPERTIES + 1
    result = strip_user_properties(QOS1, publish_packet(packed, b"{}"))
    assert result is not None and result[1] == bound
    props = decoded(result[0])[1]
    assert (props["ResponseTopic"], props["CorrelationData"]) == (REPLY, b"corr")
    # Garbage after the first property past the bound: not read, not a reason to give up.
    cut = len(packed) - (count - bound.count) * (6 + len(value))  # the unread tail
    tail_garbage = packed[:cut] + b"\x7f" * (len(packed) - cut)  # not property identifiers
    result = strip_user_properties(QOS1, publish_packet(tail_garbage, b"{}"))
    assert result is not None and result[1] == bound


def test_properties_after_the_first_past_a_bound_are_dropped_unread() -> None:
    """Correlation Data written after the user properties (paho writes it before): over
    the bounds, it is dropped with them; within them, it is kept."""
    over = properties(
        response_topic=REPLY, correlation=b"corr", user_properties=100, correlation_last=True
    )
    result = strip_user_properties(QOS1, publish_packet(over.pack(), b"{}"))
    assert result is not None and result[1] == counted(100, b"")
    props = decoded(result[0])[1]
    assert props["ResponseTopic"] == REPLY and "CorrelationData" not in props
    within = properties(
        response_topic=REPLY, correlation=b"corr", user_properties=64, correlation_last=True
    )
    assert strip_user_properties(QOS1, publish_packet(within.pack(), b"{}")) is None


@pytest.mark.parametrize(
    "props",
    [
        b"\x05" + b"\x26\x00\x01k\x00\x00" * 200,  # the block says 5 bytes: far fewer than held
        # a length past the end, before the bounds are reached (after them: never read)
        varint(1000) + b"\x26\x00\x01k\x00\x00" * 50 + b"\x26\xff\xff" + b"\x00" * 697,
        varint(1000) + b"\x7f" + b"\x00" * 999,  # not a property identifier
    ],
)
def test_the_transport_leaves_a_malformed_block_for_paho_to_refuse(props: bytes) -> None:
    assert strip_user_properties(QOS1, publish_packet(props, b"")) is None


def test_the_largest_packet_allowed_costs_paho_little_once_guarded() -> None:
    """Timings printed, not asserted: the worst packet the broker may send (every byte
    empty user properties), what the guard costs for it, and what paho then parses."""
    limit = max_packet_bytes(Settings().max_payload_bytes)
    count = (limit - 64) // 6  # a user property "k" with an empty value: 6 bytes
    props = properties(response_topic=REPLY, correlation=b"c", user_properties=count).pack()
    packet = publish_packet(props, b"")
    started = time.perf_counter()
    result = strip_user_properties(QOS1, packet)
    guard_s = time.perf_counter() - started
    assert result is not None
    started = time.perf_counter()
    assert "UserProperty" not in decoded(result[0])[1]
    parse_s = time.perf_counter() - started
    within = properties(
        response_topic=REPLY, correlation=b"c", user_properties=MAX_USER_PROPERTIES, value=b"v"
    ).pack()
    allowed = publish_packet(within, b"x" * Settings().max_payload_bytes)
    started = time.perf_counter()
    assert len(decoded(allowed)[1]["UserProperty"]) == MAX_USER_PROPERTIES
    allowed_s = time.perf_counter() - started
    measured(
        f"{count} user properties in {len(packet)} B: guard {guard_s * 1000:.1f} ms, then paho "
        f"{parse_s * 1000:.1f} ms; {MAX_USER_PROPERTIES} with a full payload: paho "
        f"{allowed_s * 1000:.1f} ms"
    )


def test_the_packet_bound_follows_the_payload_bound_up_to_mqtts_own() -> None:
    assert max_packet_bytes(256 * 1024) == 256 * 1024 + PACKET_HEADROOM_BYTES
    assert max_packet_bytes(1 << 30) == 268_435_455  # what a CONNECT can say at most


def conf_value(path: Path, option: str) -> int:
    [value] = re.findall(rf"^{option}\s+(\d+)\s*$", path.read_text(), re.MULTILINE)
    return int(value)


SHIPPED_BROKERS = [
    "compose/mosquitto/mosquitto.conf",
    "compose/mosquitto/mosquitto-dynsec.conf",
    "config/mosquitto.conf",  # make run's
]


@pytest.mark.parametrize("conf", SHIPPED_BROKERS)
def test_the_shipped_broker_refuses_packets_only_above_what_a_worker_takes_or_sends(
    conf: str,
) -> None:
    """Every shipped broker sets a `max_packet_size` (mosquitto's own default is none: a
    client may send 256 MB), and it lets through every request a worker would answer
    (its Maximum Packet Size) and every reply it may send (a result at the limit, with
    room for the reply around it): a reply the broker refused would cost the worker its
    connection."""
    defaults = Settings()
    broker_limit = conf_value(ROOT / conf, "max_packet_size")
    assert broker_limit >= max_packet_bytes(defaults.max_payload_bytes)
    assert broker_limit >= defaults.mcp.max_result_bytes + PACKET_HEADROOM_BYTES
    assert broker_limit == bench_broker.MAX_PACKET_BYTES  # the benches' broker, as shipped
