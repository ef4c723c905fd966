"""MQTT connection: one MQTT v5 connection to the broker.

It turns aiomqtt's messages into plain `Inbound` values and `Outbound` values into
publishes with MQTT v5 properties, so the rest of the worker never sees paho
objects. Reconnection policy belongs to the caller (the service loop).

Requests are acknowledged by the worker, not on arrival: paho's manual acks are
switched on and `ack(message)` sends the PUBACK once the message is answered. aiomqtt
2.x has no public API for this (aiomqtt issue #345), so the transport reaches its paho
client (`Client._client`) in one place, `socket_reader.paho_of`;
tests/transport/test_transport.py fails loudly if aiomqtt changes underneath. Receive
Maximum tells the broker how many unacknowledged requests it may push, so a flood waits
in the broker, not in our memory; `hold` keeps that true with a broker that breaks the
promise (see `socket_reader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.reasoncodes import ReasonCode

from toolbus.transport.errors import SubscriptionRefused, TransportError
from toolbus.transport.inbound_limits import (
    DROPPED_ATTRIBUTE,
    DUP_ATTRIBUTE,
    PropertyGuard,
    connect_properties,
    delivery_id,
)
from toolbus.transport.inbox import Inbox
from toolbus.transport.paho_log import PAHO_LOG
from toolbus.transport.properties import packet_bytes, publish_properties
from toolbus.transport.pubacks import Pubacks
from toolbus.transport.reasons import SESSION_TAKEN_OVER, connect_error, disconnect_reason
from toolbus.transport.socket_reader import BoundedReader, paho_of
from toolbus.transport.socket_writer import SocketWriter
from toolbus.transport.subscriptions import refused_filters, subscribe_options
from toolbus.transport.tls import tls_context
from toolbus.transport.will import last_will
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Inbound, Outbound, TooLarge

T = TypeVar("T")

# Nagle's algorithm otherwise adds 40-90 ms to every QoS 1 round trip.
_NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
# Connections given up on at the deadline that connected later, while they close.
_CLOSING: set[asyncio.Future[None]] = set()


@dataclass(frozen=True, slots=True)
class _Delivery:
    """One received message as its connection knows it: acknowledged through that
    connection only (a message id means nothing on the next one)."""

    connection: MqttConnection
    mid: int
    qos: int


def _inbound(message: aiomqtt.Message, connection: MqttConnection) -> Inbound:
    # paho sets only the properties a message carries, as attributes: read them from
    # its __dict__ (a missing one through getattr costs a raised AttributeError each).
    props = vars(message.properties) if message.properties is not None else {}
    user = props.get("UserProperty") or ()
    return Inbound(
        topic=message.topic.value,
        payload=message.payload if isinstance(message.payload, bytes) else b"",
        qos=message.qos,
        response_topic=props.get("ResponseTopic"),
        correlation_data=props.get("CorrelationData"),
        content_type=props.get("ContentType"),
        user_properties=tuple((str(k), str(v)) for k, v in user) if user else (),
        expiry_s=props.get("MessageExpiryInterval"),
        retain=message.retain,
        dropped_user_properties=props.get(DROPPED_ATTRIBUTE),
        delivery=_Delivery(connection, message.mid, message.qos),
        packet_id=message.mid if message.qos > 0 else None,
        redelivered=bool(props.get(DUP_ATTRIBUTE)),
        delivery_id=delivery_id(connection.client_id, message.mid) if message.qos > 0 else None,
    )


class MqttConnection:
    """One MQTT v5 connection: `async with MqttConnection(...) as conn`.

    Args:
        broker: where to connect, as whom, and for `mqtts://` with which CA and client
            certificate (see `tls`); TLS files it cannot use raise `BrokerRefused` here.
        client_id: MQTT client identifier (stable ids keep sessions across reconnects).
        will: `Outbound` published by the broker if the connection dies uncleanly.
        max_inflight: QoS>0 messages we publish in flight (paho caps it at 20 by default).
        receive_maximum: unacknowledged messages the broker may push to us (MQTT v5).
        manual_ack: acknowledge received messages only through `ack` (the worker: once
            answered); otherwise on arrival (requesters reading replies).
        session_expiry_s: keep the session this long after a disconnect (0: clean
            session). With a stable `client_id`, requests received but not acknowledged
            before a crash are delivered again when the same id returns.
        hold: stop reading from the broker while this many received messages wait to
            be taken; read again once half of them are (None: never stop). Its
            acknowledgements then arrive only as messages are taken: keep taking while
            subscribing, and publish on another connection.
        max_packet_bytes: MQTT v5 Maximum Packet Size (see `inbound_limits`).
        timeout_s: bound on connect/subscribe/publish acknowledgements.
        keepalive_s: MQTT keepalive: how long a silent broker is trusted.
    """

    def __init__(
        self,
        broker: BrokerUrl,
        *,
        client_id: str | None = None,
        will: Outbound | None = None,
        max_inflight: int = 1000,
        receive_maximum: int | None = None,
        manual_ack: bool = False,
        session_expiry_s: int = 0,
        hold: int | None = None,
        max_packet_bytes: int | None = None,
        timeout_s: float = 10.0,
        keepalive_s: int = 60,
    ) -> None:
        tls = tls_context(broker)  # raises BrokerRefused for TLS files it cannot use
        self._inbox: Inbox[aiomqtt.Message] = Inbox()  # aiomqtt's queue, read by `messages`
        connect = connect_properties(receive_maximum, session_expiry_s, max_packet_bytes)
        self._client = aiomqtt.Client(
            broker.host,
            broker.port,
            username=broker.username,
            password=broker.password.get_secret_value() if broker.password else None,
            identifier=client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            will=last_will(will) if will else None,
            tls_context=tls,
            timeout=timeout_s,
            keepalive=keepalive_s,
            max_inflight_messages=max_inflight,
            socket_options=_NODELAY,
            logger=PAHO_LOG,
            properties=connect,
            # Clean Start 0 only for a session meant to outlive the connection.
            clean_start=not session_expiry_s,
            queue_type=cast("type[asyncio.Queue[aiomqtt.Message]]", lambda maxsize: self._inbox),
        )
        self._paho = paho_of(self._client)
        # paho's own bound (5 s) on the TCP connect, and again on TLS, in aiomqtt's thread:
        # ours instead, halved for TLS, so the thread is done when `__aenter__` gives up.
        self._paho.connect_timeout = timeout_s / 2 if tls is not None else timeout_s
        self._paho.manual_ack_set(manual_ack)
        self._guard = PropertyGuard(self._paho)
        self._timeout_s = timeout_s
        self._acks = Pubacks()  # the PUBACKs our publishes wait for
        self._gone = asyncio.Event()  # set once paho has seen the connection go
        self._paho.on_publish = self._published
        aiomqtt_disconnected = self._paho.on_disconnect
        if aiomqtt_disconnected is None:  # aiomqtt changed: never guess
            raise TypeError("aiomqtt no longer sets paho's on_disconnect")
        self._aiomqtt_disconnected: Callable[..., None] = aiomqtt_disconnected
        self._paho.on_disconnect = self._disconnected
        aiomqtt_connected = self._paho.on_connect
        if aiomqtt_connected is None:  # aiomqtt changed: never guess
            raise TypeError("aiomqtt no longer sets paho's on_connect")
        self._aiomqtt_connected: Callable[..., None] = aiomqtt_connected
        self._paho.on_connect = self._connected
        # The CONNACK's Maximum Packet Size (nothing larger is sent: mosquitto disconnects
        # a client that does), Session Present (our session, and its numbering, kept) and
        # Shared Subscription Available (absent: available).
        self.broker_max_packet_bytes: int | None = None
        self.session_present, self.shared_subscriptions = False, True
        self._connect_failed = False  # aiomqtt then has nothing to learn of a disconnect
        self.disconnect_reason: int | None = None  # the broker's DISCONNECT reason code
        self._stack = AsyncExitStack()
        self._reader = BoundedReader(self._client, hold)
        self._writer = SocketWriter(self._paho)

    @property
    def client_id(self) -> str:
        return self._client.identifier

    @property
    def taken_over(self) -> bool:
        """Dropped because another client connected with this client id (MQTT v5 0x8E)."""
        return self.disconnect_reason == SESSION_TAKEN_OVER

    @property
    def read_pauses(self) -> int:
        """How often this connection stopped reading because `hold` messages waited."""
        return self._reader.pauses

    @property
    def read_paused(self) -> asyncio.Event:
        """Set while the connection does not read, because `hold` messages wait."""
        return self._reader.paused

    async def __aenter__(self) -> Self:
        """Connected within `timeout_s` in all (TCP, TLS and CONNACK), or `TransportError`.

        aiomqtt bounds only the wait for the CONNACK, after a socket phase in a thread
        that no cancellation stops; so the connect runs as its own task behind one
        deadline, or until the socket closes before any CONNACK (aiomqtt waits on then).
        One given up on goes on alone and is closed if it connects after all."""
        self._reader.install(asyncio.get_running_loop())
        self._writer.install(asyncio.get_running_loop())
        entering = asyncio.create_task(
            self._stack.enter_async_context(self._client), name=f"mqtt-connect:{self.client_id}"
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._unless_lost(asyncio.shield(entering), "connecting")
        except aiomqtt.MqttError as exc:
            self._drop_socket()
            raise connect_error(exc) from exc
        except BaseException as exc:  # our deadline, or our caller's cancellation
            entering.add_done_callback(self._close_late)
            if isinstance(exc, TimeoutError):
                raise TransportError(
                    f"no MQTT connection within {self._timeout_s:g} s (the host does not "
                    "answer, or what listens on the port is no MQTT broker)"
                ) from None
            raise
        self._inbox.ends_with(self._reader.ended())  # as aiomqtt's own iterator ended
        return self

    def _close_late(self, entering: asyncio.Future[Any]) -> None:
        """A connect given up on finished: close it if it connected after all."""
        if entering.cancelled() or entering.exception() is not None:
            self._drop_socket()  # never connected (the exception is retrieved: not logged)
            return
        closing = asyncio.create_task(self._close_quietly(), name="mqtt-close-late")
        _CLOSING.add(closing)  # a reference, so the task is not collected half-way
        closing.add_done_callback(_CLOSING.discard)

    def _drop_socket(self) -> None:
        """A connect that failed may leave paho's socket open (aiomqtt does not close it
        when the CONNACK wait times out): a DISCONNECT, once written, makes paho close it."""
        self._connect_failed = True
        if self._paho.socket() is not None:
            self._paho.disconnect()

    async def _close_quietly(self) -> None:
        with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
            async with asyncio.timeout(self._timeout_s):
                await self._stack.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._stack.__aexit__(exc_type, exc, tb)
        except aiomqtt.MqttError as err:
            raise TransportError(str(err)) from err
        if self._gone.is_set():  # aiomqtt keeps the loss in a future only its message
            await self.lost()  # stream reads (else "Future exception was never retrieved")

    async def subscribe(
        self, filters: Sequence[str], qos: int = 1, *, retained: bool = True
    ) -> None:
        """Subscribed to every filter, or `TransportError`: a filter the broker refused
        (an ACL's "not authorized", a shared subscription it does not support) would
        leave the connection up and silent, and the worker reporting ready for nothing.
        Without `retained` (Retain Handling 2) the broker sends no retained message on
        subscribing: a retained request would otherwise run again at every subscribe."""
        options = subscribe_options(qos, retained=retained)
        try:
            granted = await self._unless_lost(
                self._client.subscribe([(f, options) for f in filters]), "subscribing"
            )
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc
        if refused := refused_filters(filters, granted):
            shown = ", ".join(f"{f} (reason 0x{code:02x})" for f, code in refused)
            raise SubscriptionRefused(f"the broker refused the subscription to {shown}", refused)

    async def unsubscribe(self, filters: Sequence[str]) -> None:
        try:
            await self._unless_lost(self._client.unsubscribe(list(filters)), "unsubscribing")
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc

    async def _unless_lost(self, step: Awaitable[T], doing: str) -> T:
        """`step`, or `TransportError` as soon as the connection is lost: aiomqtt waits
        for a CONNACK, SUBACK or UNSUBACK its full timeout even once the broker is gone
        (a worker stopping as its broker stops, or one a partition cut off, waits it out)."""
        task = asyncio.ensure_future(step)
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await task
        if task.cancelled():
            raise TransportError(f"connection lost while {doing}")
        return task.result()

    async def messages(self) -> AsyncIterator[Inbound]:
        # From the inbox itself, not aiomqtt's iterator (a task per message: `inbox`).
        while (message := await self._inbox.next()) is not None:
            self._reader.taken()
            yield _inbound(message, self)
        raise TransportError("disconnected during message iteration") from self._inbox.cause

    @property
    def connected(self) -> bool:
        """False once paho has seen the connection go (paho's public `is_connected`)."""
        return self._paho.is_connected()

    def queued(self) -> int:
        """Messages received but not yet taken (none of them acknowledged yet)."""
        return self._inbox.qsize()

    def ack(self, message: Inbound) -> bool:
        """Acknowledge a request now that it is answered. False when it came on another
        connection, or this one is lost: the broker then delivers it again (or has
        dropped the session)."""
        delivery = message.delivery
        if not isinstance(delivery, _Delivery) or delivery.connection is not self:
            return False
        if not self.connected:
            return False
        if delivery.qos > 0:
            self._paho.ack(delivery.mid, delivery.qos)
        return True

    async def publish(self, out: Outbound, timeout_s: float | None = None) -> int:
        """Published and (QoS 1) acknowledged within `timeout_s` (the connection's bound
        by default); the PUBACK's MQTT v5 reason code (0 for QoS 0): 0x80 and above, the
        broker refused to take the message (0x87 "not authorized": its ACL), which a
        caller that must know checks (`reasons.publish_refused`). Raises
        `TransportError` as soon as the connection is lost: a dead broker never sends
        the PUBACK, and the caller could use a new connection. A
        PUBACK late on a live connection raises `Unacknowledged`, whose `late` tells
        whether it still came (a stalled broker reads the message when it resumes).

        Straight through paho, not aiomqtt's `publish`: that one costs two tasks and an
        event per message (`wait_for` around `Event.wait`); here the PUBACK resolves
        one future (see `_published`)."""
        paho_client = self._paho
        props = publish_properties(out)
        limit = self.broker_max_packet_bytes
        if limit is not None and (size := packet_bytes(out, props.pack())) > limit:
            raise TooLarge(f"a message of {size} bytes exceeds the broker's limit of {limit}")
        info = paho_client.publish(out.topic, out.payload, out.qos, out.retain, props)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise TransportError(f"could not publish: {paho.error_string(info.rc)}")
        if out.qos == 0 or info.is_published():
            return 0  # (acknowledged already: not in the same turn of the loop, in practice)
        return await self._acks.wait(info.mid, self._timeout_s if timeout_s is None else timeout_s)

    def _published(
        self, client: paho.Client, userdata: object, mid: int, reason_code: ReasonCode, _: Any
    ) -> None:
        """paho's `on_publish`: the PUBACK of one of our publishes came."""
        self._acks.came(mid, reason_code.value if isinstance(reason_code, ReasonCode) else 0)

    def _connected(self, client: paho.Client, *args: Any) -> None:
        """paho's `on_connect`, before aiomqtt's: what the CONNACK says of packet sizes
        and of our session."""
        properties = args[-1] if args else None
        self.broker_max_packet_bytes = getattr(properties, "MaximumPacketSize", None)
        self.shared_subscriptions = getattr(properties, "SharedSubscriptionAvailable", 1) != 0
        flags = args[1] if len(args) > 1 else None
        self.session_present = bool(getattr(flags, "session_present", False))
        self._aiomqtt_connected(client, *args)

    def _disconnected(self, client: paho.Client, *args: Any) -> None:
        """paho's `on_disconnect`, after aiomqtt's: no PUBACK comes on this connection now."""
        self.disconnect_reason = disconnect_reason(*args)
        if not self._connect_failed:  # (its connect future may be cancelled by then)
            self._aiomqtt_disconnected(client, *args)
            self._gone.set()
            self._inbox.close()
        self._acks.lost()

    async def lost(self, received: Callable[[Inbound], None] | None = None) -> None:
        """Returns once the connection is lost, for one that subscribes to little (the
        worker's reply connection): aiomqtt's message stream ends only then, and reading
        it retrieves the error aiomqtt would otherwise log as never retrieved. What does
        arrive goes to `received` (the status page's fleet watch), the stream's one reader."""
        with contextlib.suppress(aiomqtt.MqttError):
            async for message in self._client.messages:
                if received is not None:
                    received(_inbound(message, self))
