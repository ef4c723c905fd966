"""Test-side MQTT callers, speaking v5 (Response Topic + Correlation Data) or 3.1.1 (reply_to + id).

Tests talk to the broker with aiomqtt directly: they play the worker's callers,
so they must not depend on the worker's own transport.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from types import TracebackType
from typing import Any, Self

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from toolbus.config import BrokerUrl
from toolbus.wire.topics import Topics

REPLY_TIMEOUT_S = 15.0


def reply_topic_for(topics: Topics, name: str | None = None) -> str:
    """A reply topic the worker accepts: under its first allowed prefix (fresh unless named)."""
    return f"{topics.reply_prefixes[0]}{name or uuid.uuid4().hex[:8]}"


def call_topic(topics: Topics, tool: str | None = None) -> str:
    """`{prefix}/call/{tool}`, or the bare call topic (tool named in the body)."""
    return f"{topics.call}/{tool}" if tool else topics.call


class Caller:
    def __init__(
        self,
        url: str,
        *,
        v5: bool = True,
        username: str | None = None,
        password: str | None = None,
        client_id: str | None = None,
    ) -> None:
        b = BrokerUrl.from_url(url)
        self.v5 = v5
        self.client = aiomqtt.Client(
            b.host,
            b.port,
            username=username,
            password=password,
            identifier=client_id or f"test-{uuid.uuid4().hex[:10]}",
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            max_inflight_messages=1000,
            # As the worker does: without it each QoS 1 round trip can wait out Nagle's
            # delay, and the callers, not the worker, would set the pace of a load test.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        self.client.pending_calls_threshold = 10_000
        # Replies to `call()` go to the waiting future (by correlation data or body id);
        # everything else lands in `messages`, so nothing is ever dropped unseen.
        self._pending: dict[bytes, asyncio.Future[aiomqtt.Message]] = {}
        self.messages: asyncio.Queue[aiomqtt.Message] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._subscribed: set[str] = set()

    async def __aenter__(self) -> Self:
        await self.client.__aenter__()
        self._reader = asyncio.create_task(self._read(), name="test-caller-reader")
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._reader is not None
        self._reader.cancel()
        await self.client.__aexit__(t, e, tb)

    async def _read(self) -> None:
        async for message in self.client.messages:
            future = self._pending.pop(self._key(message) or b"", None)
            if future is not None and not future.done():
                future.set_result(message)
            else:
                await self.messages.put(message)

    def _key(self, message: aiomqtt.Message) -> bytes | None:
        if self.v5:
            return getattr(message.properties, "CorrelationData", None)
        try:
            ident = json.loads(message.payload).get("id")
        except (ValueError, AttributeError):
            return None
        return ident.encode() if isinstance(ident, str) else None

    async def subscribe(self, topic: str) -> int:
        """Subscribed (QoS 1); returns the broker's reason code (0x80 and up: refused)."""
        if topic in self._subscribed:
            return 1
        granted = await self.client.subscribe(topic, qos=1)
        first = granted[0] if granted else 0x80
        code = first.value if isinstance(first, ReasonCode) else int(first)
        if code < 0x80:
            self._subscribed.add(topic)
        return code

    async def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        response_topic: str | None = None,
        correlation: bytes | None = None,
        user_properties: tuple[tuple[str, str], ...] = (),
        expiry_s: int | None = None,
    ) -> None:
        props = None
        if self.v5 and (response_topic or correlation or user_properties or expiry_s):
            props = Properties(PacketTypes.PUBLISH)
            if expiry_s:
                props.MessageExpiryInterval = expiry_s
            if response_topic:
                props.ResponseTopic = response_topic
            if correlation is not None:
                props.CorrelationData = correlation
            for pair in user_properties:
                props.UserProperty = pair  # paho appends: one assignment per pair
        await self.client.publish(topic, payload, qos=1, properties=props)

    async def next_message(self, timeout_s: float = REPLY_TIMEOUT_S) -> aiomqtt.Message:
        async with asyncio.timeout(timeout_s):
            return await self.messages.get()

    async def call(
        self,
        topic: str,
        body: dict[str, Any] | bytes,
        *,
        reply_topic: str,
        timeout_s: float = REPLY_TIMEOUT_S,
    ) -> tuple[dict[str, Any], aiomqtt.Message]:
        """One request; returns the parsed reply and the raw message (for its properties)."""
        await self.subscribe(reply_topic)
        correlation = uuid.uuid4().hex.encode()
        # Registered before publishing: a fast reply must find its waiter.
        future: asyncio.Future[aiomqtt.Message] = asyncio.get_running_loop().create_future()
        self._pending[correlation] = future
        if isinstance(body, dict) and not self.v5:
            body = {"reply_to": reply_topic, "id": correlation.decode(), **body}
        payload = json.dumps(body).encode() if isinstance(body, dict) else body
        await self.publish(
            topic,
            payload,
            response_topic=reply_topic if self.v5 else None,
            correlation=correlation if self.v5 else None,
        )
        try:
            async with asyncio.timeout(timeout_s):
                message = await future
        finally:
            self._pending.pop(correlation, None)
        assert message.topic.value == reply_topic
        return json.loads(message.payload), message

    async def call_tool(
        self,
        topics: Topics,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        *,
        reply_topic: str | None = None,
        wait_s: float = REPLY_TIMEOUT_S,
        **fields: Any,
    ) -> dict[str, Any]:
        """Call `tool` on its topic (None: the bare call topic, `tool` in `fields`) and
        return the parsed reply. `fields` go into the body (`id`, `timeout_s`, ...);
        `wait_s` bounds the wait for the reply."""
        body: dict[str, Any] = dict(fields)
        if arguments is not None:
            body["arguments"] = arguments
        reply, _ = await self.call(
            call_topic(topics, tool),
            body,
            reply_topic=reply_topic or reply_topic_for(topics),
            timeout_s=wait_s,
        )
        return reply

    async def list_tools(self, topics: Topics, caller: str | None = None) -> list[dict[str, Any]]:
        """The tool definitions the worker lists (for `caller`, when named)."""
        topic = f"{topics.tools}/{caller}" if caller else topics.tools
        reply, _ = await self.call(topic, {}, reply_topic=reply_topic_for(topics))
        assert reply["ok"], reply
        return list(reply["result"]["structured"]["tools"])

    def unclaimed(self) -> list[aiomqtt.Message]:
        """Messages received so far that no `call` was waiting for (taken from the queue)."""
        taken = []
        while not self.messages.empty():
            taken.append(self.messages.get_nowait())
        return taken


def correlation_of(message: aiomqtt.Message) -> bytes | None:
    return getattr(message.properties, "CorrelationData", None)
