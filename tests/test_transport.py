"""The transport's reach past aiomqtt: manual acks and a bounded socket reader.

aiomqtt 2.x has no public API for acking a message once it is answered (aiomqtt issue
#345), so the transport uses `aiomqtt.Client._client`, and it reads the socket itself to
stop reading while `hold` messages wait. These tests fail loudly when an aiomqtt upgrade
moves or changes what that relies on; the delivery tests then say why it matters
(tests/test_delivery.py), and the flood in tests/test_chaos.py what `hold` is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator

import aiomqtt
import paho.mqtt.client as paho

from tests.harness import Broker
from tests.mqtt import Caller
from toolbus.config import BrokerUrl
from toolbus.messages import Inbound
from toolbus.transport.connection import MqttConnection, _Delivery
from toolbus.transport.socket_reader import paho_of


async def test_aiomqtt_still_wraps_a_paho_client_we_can_ack_through() -> None:
    client = aiomqtt.Client("127.0.0.1", 1, protocol=aiomqtt.ProtocolVersion.V5)
    inner = paho_of(client)
    assert isinstance(inner, paho.Client)
    assert list(inspect.signature(inner.ack).parameters) == ["mid", "qos"]
    assert "mid" in inspect.signature(aiomqtt.Message.__init__).parameters


async def test_a_connection_acks_only_what_it_received() -> None:
    broker = BrokerUrl.from_url("mqtt://127.0.0.1:1")
    connection = MqttConnection(broker, receive_maximum=8, manual_ack=True)
    other = MqttConnection(broker)
    assert paho_of(connection._client)._manual_ack is True  # set before connecting
    stray = Inbound(topic="t", payload=b"")
    assert connection.ack(stray) is False  # no delivery token: not ours to ack
    message = Inbound(topic="t", payload=b"", delivery=_delivery(other, mid=7))
    assert connection.ack(message) is False  # another connection's message id


def _delivery(connection: MqttConnection, mid: int) -> object:
    return _Delivery(connection, mid, 1)


HOLD = 8
TOPIC = f"hold/{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def paused(
    broker: Broker, count: int, keepalive_s: int = 60
) -> AsyncIterator[MqttConnection]:
    """A connection with `hold`, once `count` messages were sent to it and it paused.
    Receive Maximum is far above: the broker alone would push them all."""
    url = BrokerUrl.from_url(broker.url)
    conn = MqttConnection(
        url, receive_maximum=1000, hold=HOLD, manual_ack=True, keepalive_s=keepalive_s
    )
    async with conn, Caller(broker.url) as sender:
        await conn.subscribe([TOPIC])
        await asyncio.gather(*(sender.publish(TOPIC, str(n)) for n in range(count)))
        async with asyncio.timeout(10):
            await conn.read_paused.wait()
        yield conn


async def take(conn: MqttConnection, count: int) -> int:
    """Take and ack `count` messages; the deepest the queue was meanwhile."""
    deepest = 0
    messages = conn.messages()
    for n in range(count):
        message = await anext(messages)
        deepest = max(deepest, conn.queued())
        assert int(message.payload) == n  # in order, none lost
        assert conn.ack(message)
    return deepest


async def test_a_connection_stops_reading_while_hold_messages_wait(broker: Broker) -> None:
    """The broker may push more than Receive Maximum (mosquitto < 2.0.13 does, after
    acks; QoS 0 is never limited): with `hold` waiting, the socket is not read, so the
    rest waits in the broker; taking messages reads again, and nothing is lost."""
    async with paused(broker, 200) as conn:
        assert conn.queued() == HOLD
        async with asyncio.timeout(30):
            deepest = await take(conn, 200)
    assert deepest <= HOLD
    assert conn.read_pauses > 1


async def test_an_unsubscribe_is_acknowledged_while_messages_are_taken(broker: Broker) -> None:
    """The UNSUBACK queues behind what the broker already sent: it arrives as those are
    taken, and the bound holds meanwhile (no reading ahead to find it)."""
    async with paused(broker, 200) as conn, asyncio.timeout(30):
        taking = asyncio.create_task(take(conn, 200), name="take")
        await conn.unsubscribe([TOPIC])
        assert await taking <= HOLD


async def test_a_paused_connection_outlives_its_keepalive(broker: Broker) -> None:
    """Paused, it reads no PINGRESP: a packet read every quarter keepalive keeps paho
    from dropping it (2 s keepalive; paho would give up after about 4 s)."""
    async with paused(broker, 50, keepalive_s=2) as conn:
        await asyncio.sleep(6)  # the span under test: nothing to wait for but time
        assert conn.connected
        assert HOLD < conn.queued() <= HOLD + 6 / 0.5 + 1  # a packet per 0.5 s probe
