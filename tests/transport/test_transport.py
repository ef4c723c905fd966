"""The transport's reach past aiomqtt: manual acks, a bounded socket reader, publishes
straight through paho with properties we encode, and writes once per loop turn.

aiomqtt 2.x has no public API for acking a message once it is answered (aiomqtt issue
#345), so the transport uses `aiomqtt.Client._client`, and it reads the socket itself to
stop reading while `hold` messages wait. These tests fail loudly when an aiomqtt upgrade
moves or changes what that relies on; the delivery tests then say why it matters
(tests/worker/test_delivery.py), and the flood in tests/worker/test_chaos.py what `hold` is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from tests.support.harness import Broker
from tests.support.mqtt import Caller
from toolbus.config import BrokerUrl
from toolbus.transport import TransportError, Unacknowledged
from toolbus.transport.connection import MqttConnection, _Delivery
from toolbus.transport.properties import publish_properties
from toolbus.transport.pubacks import Pubacks
from toolbus.transport.socket_reader import paho_of
from toolbus.transport.subscriptions import refused_filters
from toolbus.wire.messages import Inbound, Outbound
from toolbus.worker.publisher import ConnectionPublisher


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


async def take(
    conn: MqttConnection, count: int, messages: AsyncIterator[Inbound] | None = None, first: int = 0
) -> int:
    """Take and ack `count` messages (numbered from `first`); the deepest the queue was."""
    deepest = 0
    messages = messages or conn.messages()
    for n in range(first, first + count):
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
        messages = conn.messages()
        async with asyncio.timeout(30):
            # Taken down to half: reading resumes, and the broker's rest fills it again.
            deepest = await take(conn, HOLD // 2 + 1, messages)
            assert not conn.read_paused.is_set()
            await conn.read_paused.wait()
            assert conn.read_pauses == 2 and conn.queued() == HOLD
            taken = HOLD // 2 + 1
            deepest = max(deepest, await take(conn, 200 - taken, messages, first=taken))
    assert deepest <= HOLD


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


# Replies leave through paho directly, with properties we encode ourselves
# (transport/properties.py) and packets written once per loop turn (socket_writer.py).

PROPERTY_CASES = [
    Outbound(topic="t", payload=b""),
    Outbound(topic="t", payload=b"", correlation_data=b"\x00\x01corr"),
    Outbound(
        topic="t",
        payload=b"",
        expiry_s=70000,
        content_type="application/json",
        response_topic="toolbus/reply/é/x",
        correlation_data=b"",
        user_properties=(("traceparent", "00-ab-cd-01"), ("toolbus-id", "ünï"), ("k", "")),
    ),
    Outbound(topic="t", payload=b"", response_topic="r" * 200, user_properties=(("a", "b"),) * 40),
]


@pytest.mark.parametrize("out", PROPERTY_CASES)
def test_packed_properties_are_the_bytes_paho_would_send(out: Outbound) -> None:
    expected = Properties(PacketTypes.PUBLISH)
    if out.expiry_s is not None:
        expected.MessageExpiryInterval = out.expiry_s
    if out.content_type:
        expected.ContentType = out.content_type
    if out.response_topic:
        expected.ResponseTopic = out.response_topic
    if out.correlation_data is not None:
        expected.CorrelationData = out.correlation_data
    for key, value in out.user_properties:
        expected.UserProperty = (key, value)
    assert publish_properties(out).pack() == expected.pack()


def test_a_property_too_long_for_mqtt_is_refused() -> None:
    with pytest.raises(ValueError, match="65535"):
        publish_properties(Outbound(topic="t", payload=b"", response_topic="r" * 70000))


async def test_concurrent_publishes_arrive_acknowledged_with_their_properties(
    broker: Broker,
) -> None:
    """Many publishes queued in one loop turn leave in one write each turn; each is
    acknowledged, and each arrives with its own correlation data and user properties."""
    url = BrokerUrl.from_url(broker.url)
    topic = f"props/{uuid.uuid4().hex[:8]}"
    count = 300
    async with MqttConnection(url) as sender, MqttConnection(url) as receiver:
        await receiver.subscribe([topic])
        outs = [
            Outbound(
                topic=topic,
                payload=str(n).encode(),
                correlation_data=n.to_bytes(4, "big"),
                response_topic=f"reply/{n}",
                user_properties=(("n", str(n)),),
                expiry_s=60,
            )
            for n in range(count)
        ]
        async with asyncio.timeout(20):
            await asyncio.gather(*(sender.publish(out) for out in outs))
            seen: dict[int, Inbound] = {}
            async for message in receiver.messages():
                seen[int(message.payload)] = message
                if len(seen) == count:
                    break
    for n, message in seen.items():
        assert message.correlation_data == n.to_bytes(4, "big")
        assert message.response_topic == f"reply/{n}"
        assert message.user_properties == (("n", str(n)),)
        assert message.expiry_s is not None and 0 < message.expiry_s <= 60


async def fails_at_once_when_it_dies(own: Broker, waiting: asyncio.Task[Any]) -> None:
    """`waiting` (on a stopped broker) gets no answer; once the broker dies, still
    stopped so it sends nothing more, it fails at once: the connection is lost, and
    nothing waits out its own 30 s bound."""
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done
    own.kill()
    started = time.monotonic()
    with pytest.raises(TransportError):
        async with asyncio.timeout(10):
            await waiting
    assert time.monotonic() - started < 5


async def test_a_publish_waiting_for_its_puback_fails_when_the_broker_dies(
    tmp_path: Path,
) -> None:
    """A frozen broker sends no PUBACK; once it dies the publish fails at once (the
    connection is lost), not after the publish's own 30 s bound."""
    own = Broker(tmp_path)
    own.start()
    try:
        async with MqttConnection(BrokerUrl.from_url(own.url), keepalive_s=60) as conn:
            assert own.process is not None
            own.process.send_signal(signal.SIGSTOP)
            waiting = asyncio.create_task(
                conn.publish(Outbound(topic="t/x", payload=b"1"), timeout_s=30)
            )
            await fails_at_once_when_it_dies(own, waiting)  # no PUBACK meanwhile
    finally:
        own.kill()


async def test_a_publish_without_its_puback_in_time_fails_and_forgets_it(tmp_path: Path) -> None:
    own = Broker(tmp_path)
    own.start()
    try:
        async with MqttConnection(BrokerUrl.from_url(own.url)) as conn:
            assert own.process is not None
            own.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(TransportError):
                    await conn.publish(Outbound(topic="t/x", payload=b"1"), timeout_s=0.3)
                assert len(conn._acks) == 0  # nothing left waiting for a PUBACK
            finally:
                own.process.send_signal(signal.SIGCONT)
    finally:
        own.kill()


async def test_a_reply_without_its_puback_in_time_is_sent_once_and_given_up(
    tmp_path: Path,
) -> None:
    """The publisher's bound covers every attempt: a PUBACK that came too late leaves no
    time to send again, so a slow broker gets the reply once, not once per retry."""
    own = Broker(tmp_path)
    own.start()
    topic = f"once/{uuid.uuid4().hex[:8]}"
    url = BrokerUrl.from_url(own.url)
    try:
        async with MqttConnection(url) as receiver, MqttConnection(url) as conn:
            await receiver.subscribe([topic])
            publisher = ConnectionPublisher(timeout_s=0.5)
            publisher.attach(conn)
            assert own.process is not None
            own.process.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            try:
                async with asyncio.timeout(5):
                    await publisher.publish(Outbound(topic=topic, payload=b"reply"))
            finally:
                own.process.send_signal(signal.SIGCONT)
            assert time.monotonic() - started < 3  # given up within its bound
            await publisher.publish(Outbound(topic=topic, payload=b"sentinel"))
            seen = []
            async with asyncio.timeout(10):
                async for message in receiver.messages():
                    seen.append(message.payload)
                    if message.payload == b"sentinel":
                        break
        assert seen == [b"reply", b"sentinel"]  # once, then what came after it
    finally:
        own.kill()


def test_a_refused_subscription_is_found_in_the_suback() -> None:
    """mosquitto grants every filter and filters delivery by ACL; other brokers (EMQX,
    HiveMQ, mosquitto's dynamic security) refuse in the SUBACK, which the connection
    turns into an error rather than a worker that reports ready and hears nothing."""
    granted = [
        ReasonCode(PacketTypes.SUBACK, identifier=1),
        ReasonCode(PacketTypes.SUBACK, identifier=0x87),
    ]
    filters = ["$share/toolbus/toolbus/call/#", "$share/toolbus/toolbus/tools/#"]
    assert refused_filters(filters, granted) == [("$share/toolbus/toolbus/tools/#", 0x87)]
    assert refused_filters(filters, [1, 0x80]) == [(filters[1], 0x80)]  # MQTT 3.1.1's failure
    assert refused_filters(filters, [0, 1]) == []


async def test_an_unsubscribe_waiting_for_its_unsuback_fails_when_the_broker_dies(
    tmp_path: Path,
) -> None:
    """A worker stopping as its broker stops unsubscribes first: once the connection is
    lost that fails at once, not after the connection's own 30 s bound."""
    own = Broker(tmp_path)
    own.start()
    try:
        url = BrokerUrl.from_url(own.url)
        async with MqttConnection(url, timeout_s=30) as conn:
            await conn.subscribe(["t/#"])
            assert own.process is not None
            own.process.send_signal(signal.SIGSTOP)
            waiting = asyncio.create_task(conn.unsubscribe(["t/#"]))
            await fails_at_once_when_it_dies(own, waiting)  # no UNSUBACK meanwhile
    finally:
        own.kill()


async def test_a_connection_lost_while_nobody_reads_leaves_no_error_unretrieved(
    tmp_path: Path,
) -> None:
    """aiomqtt keeps the loss in a future only its message stream reads; a connection
    closed after its loss reads it, or asyncio logs "Future exception was never
    retrieved" (a worker that stops as its broker goes logged two)."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    own = Broker(tmp_path)
    own.start()
    try:
        conn = MqttConnection(BrokerUrl.from_url(own.url))
        async with conn:
            own.kill()
            with pytest.raises(TransportError):  # fails once paho has seen the loss
                async with asyncio.timeout(10):
                    await conn.publish(Outbound(topic="t/x", payload=b"1"))
        del conn
        gc.collect()
        assert unhandled == []
    finally:
        loop.set_exception_handler(previous)
        own.kill()


async def test_paho_logs_a_dropped_connection_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """paho says "failed to receive on socket" at ERROR when a broker resets the
    connection; the worker logs the loss itself and reconnects, so it is a warning.
    paho's other errors keep their level."""
    conn = MqttConnection(BrokerUrl.from_url("mqtt://127.0.0.1:1"))
    inner = paho_of(conn._client)
    with caplog.at_level(logging.WARNING, logger="mqtt"):
        reset = ConnectionResetError(104, "Connection reset by peer")
        inner._easy_log(paho.MQTT_LOG_ERR, "failed to receive on socket: %s", reset)
        inner._easy_log(paho.MQTT_LOG_ERR, "Caught exception in on_socket_open: %s", reset)
    assert [(r.name, r.levelno) for r in caplog.records] == [
        ("mqtt", logging.WARNING),
        ("mqtt", logging.ERROR),
    ]


async def test_a_puback_read_as_its_wait_runs_out_still_acknowledges() -> None:
    """The bound on a PUBACK and the PUBACK itself in one turn of the loop (a stalled
    broker resuming just then): the PUBACK came, so the wait ends acknowledged, or its
    `late` resolves. Lost, its request would stay unacknowledged on a live connection,
    holding one of the broker's Receive Maximum slots for the worker until a reconnect."""
    loop = asyncio.get_running_loop()
    acks = Pubacks()
    waiting = asyncio.create_task(acks.wait(1, 0))
    await asyncio.sleep(0)  # the wait has begun: its bound is due now
    loop.call_later(0, acks.came, 1)  # its PUBACK, read in the same turn, after the bound
    try:
        async with asyncio.timeout(5):
            await waiting
    except Unacknowledged as exc:
        async with asyncio.timeout(5):
            await exc.late


async def first_message(connection: MqttConnection) -> Inbound:
    async with asyncio.timeout(10):
        async for message in connection.messages():
            return message
    raise AssertionError("the connection ended without a message")


async def test_a_broker_redelivery_is_marked_redelivered(broker: Broker) -> None:
    """MQTT's DUP flag, which aiomqtt's `Message` drops, reaches the `Inbound`: a message
    left unacknowledged is delivered again on the resumed session, marked; the first
    delivery is not (issue 30.1: a provider's id replays only for the broker's copy)."""
    url, client_id = BrokerUrl.from_url(broker.url), f"dup-{uuid.uuid4().hex[:8]}"
    topic = f"dup/{uuid.uuid4().hex[:8]}"

    def connection() -> MqttConnection:
        return MqttConnection(url, client_id=client_id, manual_ack=True, session_expiry_s=60)

    async with connection() as conn:
        await conn.subscribe([topic])
        async with Caller(broker.url) as sender:
            await sender.publish(topic, b"once")
        first = await first_message(conn)  # never acknowledged
    async with connection() as conn:
        again = await first_message(conn)
        assert conn.ack(again)
    assert (first.payload, first.redelivered) == (b"once", False)
    assert (again.payload, again.redelivered) == (b"once", True)
    assert again.packet_id == first.packet_id
