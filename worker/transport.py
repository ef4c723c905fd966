"""MQTT transport: the only module that imports aiomqtt.

It turns aiomqtt's messages into plain `Inbound` values and `Outbound` values into
publishes with MQTT v5 properties, so the rest of the worker never sees paho
objects. Reconnection policy belongs to the caller (the service loop).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Self

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from toolbus.config import BrokerUrl
from toolbus.messages import Inbound, Outbound

# Nagle's algorithm otherwise adds 40-90 ms to every QoS 1 round trip.
_NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


class TransportError(Exception):
    """The broker connection failed or was lost."""


def _properties(out: Outbound, packet_type: int = PacketTypes.PUBLISH) -> Properties:
    props = Properties(packet_type)
    if out.content_type:
        props.ContentType = out.content_type
    if out.correlation_data is not None:
        props.CorrelationData = out.correlation_data
    if out.response_topic:
        props.ResponseTopic = out.response_topic
    for key, value in out.user_properties:
        props.UserProperty = (key, value)  # paho appends on each assignment
    return props


def _inbound(message: aiomqtt.Message) -> Inbound:
    props = message.properties
    # paho raises AttributeError for a property the message does not carry.
    user = getattr(props, "UserProperty", None) or ()
    return Inbound(
        topic=message.topic.value,
        payload=message.payload if isinstance(message.payload, bytes) else b"",
        qos=message.qos,
        response_topic=getattr(props, "ResponseTopic", None),
        correlation_data=getattr(props, "CorrelationData", None),
        content_type=getattr(props, "ContentType", None),
        user_properties=tuple((str(k), str(v)) for k, v in user),
    )


class MqttConnection:
    """One MQTT v5 connection: `async with MqttConnection(...) as conn`.

    Args:
        broker: where to connect.
        client_id: MQTT client identifier (stable ids keep sessions across reconnects).
        will: `Outbound` published by the broker if the connection dies uncleanly.
        max_inflight: QoS>0 messages in flight each way (paho caps it at 20 by default).
        timeout_s: bound on connect/subscribe/publish acknowledgements.
        tcp_nodelay: off only for the benchmark's baseline; never in production.
    """

    def __init__(
        self,
        broker: BrokerUrl,
        *,
        client_id: str | None = None,
        will: Outbound | None = None,
        max_inflight: int = 1000,
        timeout_s: float = 10.0,
        tcp_nodelay: bool = True,
    ) -> None:
        tls = ssl.create_default_context() if broker.tls else None
        self._client = aiomqtt.Client(
            broker.host,
            broker.port,
            username=broker.username,
            password=broker.password,
            identifier=client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            will=_will(will) if will else None,
            tls_context=tls,
            timeout=timeout_s,
            max_inflight_messages=max_inflight,
            socket_options=_NODELAY if tcp_nodelay else (),
        )
        # Replies are published concurrently by design; aiomqtt would warn on each.
        self._client.pending_calls_threshold = max_inflight
        self._stack = AsyncExitStack()

    @property
    def client_id(self) -> str:
        return self._client.identifier

    async def __aenter__(self) -> Self:
        try:
            await self._stack.enter_async_context(self._client)
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc
        return self

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

    async def subscribe(self, filters: Sequence[str], qos: int = 1) -> None:
        try:
            await self._client.subscribe([(f, qos) for f in filters])
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc

    async def unsubscribe(self, filters: Sequence[str]) -> None:
        try:
            await self._client.unsubscribe(list(filters))
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc

    async def messages(self) -> AsyncIterator[Inbound]:
        try:
            async for message in self._client.messages:
                yield _inbound(message)
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc

    def queued(self) -> int:
        """Messages received and acknowledged by the client but not yet taken."""
        return len(self._client.messages)

    async def publish(self, out: Outbound, timeout_s: float | None = None) -> None:
        try:
            await self._client.publish(
                out.topic,
                out.payload,
                qos=out.qos,
                retain=out.retain,
                properties=_properties(out),
                timeout=timeout_s,
            )
        except aiomqtt.MqttError as exc:
            raise TransportError(str(exc)) from exc


def _will(out: Outbound) -> aiomqtt.Will:
    return aiomqtt.Will(
        topic=out.topic,
        payload=out.payload,
        qos=out.qos,
        retain=out.retain,
        properties=_properties(out, PacketTypes.WILLMESSAGE),
    )
