"""One caller cannot fill the broker's memory through a worker's queue (trial of issue 24).

Requests wait in the broker in a worker's session (each member's, on the shared
subscription): while it is busy, and while it is away after a crash. The shipped configs
let a session queue 100 000 requests (`max_queued_messages`) so that a flood waits
rather than being dropped; with no bound on their bytes, each may be as large as the
worker's Maximum Packet Size (`max_payload_bytes` + 64 KiB, mosquitto drops larger ones
for it unqueued). Measured against a running worker under the shipped ACL: one login
publishing 6 000 requests of 250 KiB in 7 s took mosquitto from 13 MiB to 2.2 GiB (never
given back); 100 000 of them would be 25 GiB, and a broker out of memory answers no one.

mosquitto's `$SYS/broker/store/messages/bytes` counts the payload bytes it holds, queued
ones included: the shipped configs must keep a session's backlog under QUEUE_CEILING.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.fleet import SHIPPED_BROKERS, shipped_broker
from toolbus.config import BrokerUrl

ROOT = Path(__file__).parents[2]
REQUEST_BYTES = 250 * 1024  # under a worker's default Maximum Packet Size (256 + 64 KiB)
QUEUE_CEILING = 256 * 1024 * 1024 + REQUEST_BYTES  # a backlog's bytes, and one in flight
FLOOD = 1_300  # 317 MiB: more than the ceiling, a second's publishing on loopback
WAIT_S = 120


def client(url: str, identifier: str, *, keep_session: bool = False) -> aiomqtt.Client:
    broker = BrokerUrl.from_url(url)
    connect = Properties(PacketTypes.CONNECT)
    if keep_session:
        connect.SessionExpiryInterval = 3600
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=identifier,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=not keep_session,
        properties=connect,
        max_queued_outgoing_messages=0,
    )


async def stored_bytes(url: str) -> int:
    """The broker's count, from an update published after we asked (not the retained one)."""
    async with client(url, "store-reader") as reader:
        await reader.subscribe("$SYS/broker/store/messages/bytes")
        async for message in reader.messages:
            if not message.retain:
                return int(bytes(message.payload))
    raise AssertionError("no $SYS update")


@pytest.mark.parametrize("shipped", SHIPPED_BROKERS)
async def test_a_shipped_broker_bounds_the_bytes_a_worker_session_queues(
    shipped: str, tmp_path: Path
) -> None:
    """A worker's session away (a crash: its subscription and session stay), one client
    publishes FLOOD requests just under the worker's packet limit: the broker must not
    hold more than QUEUE_CEILING of them."""
    (tmp_path / "mosquitto").mkdir()
    broker = shipped_broker(tmp_path / "mosquitto", shipped)
    broker.start()
    try:
        async with client(broker.url, "worker-stand-in", keep_session=True) as worker:
            await worker.subscribe("$share/toolbus/toolbus/call/#", qos=1)
        body = b'{"arguments": {"text": "' + b"z" * REQUEST_BYTES + b'"}}'
        async with asyncio.timeout(WAIT_S), client(broker.url, "flooder") as flooder:
            for _ in range(FLOOD):
                await flooder.publish("toolbus/call/kitchen/echo", body, qos=1)
        async with asyncio.timeout(WAIT_S):
            held = await stored_bytes(broker.url)
    finally:
        broker.stop()
    assert held <= QUEUE_CEILING, f"{shipped}'s broker holds {held / 2**20:.0f} MiB of requests"


def limits(path: Path) -> dict[str, str]:
    words = (line.split() for line in path.read_text().splitlines())
    return {w[0]: w[1] for w in words if len(w) == 2 and re.fullmatch(r"max_\w+", w[0])}


def test_the_dynsec_config_has_the_broker_limits_of_the_acl_one() -> None:
    """mosquitto-dynsec.conf is used instead of mosquitto.conf: it must not drop the
    packet and queue bounds (without `max_packet_size` a caller's PUBLISH may be
    mosquitto's default 256 MiB: a 100 MB one was taken and acknowledged)."""
    shipped = ROOT / "compose" / "mosquitto"
    assert limits(shipped / "mosquitto-dynsec.conf") == limits(shipped / "mosquitto.conf")
