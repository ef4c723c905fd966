"""Client: the requester's half of a call, as `toolbus call`, embedders and the tests make it.

A call is published with its own `id`, a private reply topic and Correlation Data, and
a Message Expiry Interval equal to how long the requester will wait. When no reply
comes within the retry interval it is published again, the same `id` and the same
correlation, up to `Retry.attempts` sends in all: a worker that crashed with the call
is replaced by one that gets the repeat, and the worker's deduplication
(`dedup_store`) makes sure the tool runs at most once for it. The first reply wins;
later ones (a late original, a replay) are dropped.

The connection is kept for the client's lifetime and re-made when the broker goes away,
so calls made across a broker restart are sent again once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from pydantic import ValidationError

from toolbus.broker import BrokerUrl
from toolbus.contracts import Reply
from toolbus.messages import Outbound
from toolbus.tasks import cancel_and_wait
from toolbus.transport import MqttConnection, TransportError

log = logging.getLogger("toolbus.client")

RECONNECT_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # then 1 s apart: a broker restarting


class NoReply(Exception):
    """No reply arrived within the deadline, after every attempt."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Send a call again, under the same id, when no reply came within `interval_s`;
    `attempts` sends in all (1: never again)."""

    attempts: int = 3
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.interval_s <= 0:
            raise ValueError("a retry needs at least one attempt and a positive interval")


NO_RETRY = Retry(attempts=1, interval_s=math.inf)


class Client:
    """Calls over one MQTT v5 connection: `async with Client(broker, ...) as client`.

    Args:
        broker: where to connect, with the credentials and TLS files
            (`BrokerUrl.from_url("mqtts://host", ca_file=Path("ca.pem"))`).
        reply_prefix: an allowed reply prefix of the workers; the reply topic is
            `{reply_prefix}{client_id}`.
        retry: when and how often a call is sent again.
        client_id: MQTT client identifier (random by default).
        connect_timeout_s: bound on the first connection (and each acknowledgement).
    """

    def __init__(
        self,
        broker: BrokerUrl,
        *,
        reply_prefix: str,
        retry: Retry = Retry(),  # frozen: one shared default is safe
        client_id: str | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self._broker = broker
        self._retry = retry
        self.client_id = client_id or f"toolbus-client-{uuid.uuid4().hex[:12]}"
        self.reply_topic = f"{reply_prefix}{self.client_id}"
        self._connect_timeout_s = connect_timeout_s
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        self._connection: MqttConnection | None = None
        self._connected = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.sent = 0  # publishes, first sends and repeats
        self.resent = 0  # repeats only

    async def __aenter__(self) -> Self:
        """Connected and subscribed; raises `TransportError` when the broker cannot be
        reached now (later losses are re-connected)."""
        first = await self._connect()
        self._reader = asyncio.create_task(self._read(first), name=f"client-{self.client_id}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            await cancel_and_wait(self._reader, self._connect_timeout_s)
        for future in self._pending.values():
            future.cancel()
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(TransportError):
                await connection.__aexit__(None, None, None)

    async def call(self, topic: str, body: dict[str, Any], *, timeout_s: float) -> Reply:
        """Publish a request and wait, re-sending it, until its reply or `timeout_s`.

        The body gets an `id` when it has none: a repeat must be recognisable as one.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        body = {**body, "id": body.get("id") or uuid.uuid4().hex}
        payload = json.dumps(body).encode()
        correlation = uuid.uuid4().hex.encode()
        reply: asyncio.Future[Reply] = loop.create_future()
        self._pending[correlation] = reply
        try:
            for attempt in range(self._retry.attempts):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                if attempt:
                    self.resent += 1
                    log.info("no reply to %s yet: sending it again (%d)", body["id"], attempt + 1)
                await self._send(
                    Outbound(
                        topic=topic,
                        payload=payload,
                        response_topic=self.reply_topic,
                        correlation_data=correlation,
                        expiry_s=math.ceil(remaining),  # the worker's deadline is ours too
                    ),
                    deadline,
                )
                last = attempt == self._retry.attempts - 1
                wait_s = deadline - loop.time()
                if not last:
                    wait_s = min(wait_s, self._retry.interval_s)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, wait_s)):
                        return await asyncio.shield(reply)
            raise NoReply(f"no reply to {body['id']} on {self.reply_topic} within {timeout_s:g} s")
        finally:
            self._pending.pop(correlation, None)

    async def _send(self, out: Outbound, deadline: float) -> None:
        """Publish once the connection is up; across a broker restart, once it is back."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._connected.wait()
            except TimeoutError:
                raise NoReply("the broker connection did not come back in time") from None
            connection = self._connection
            if connection is None:
                continue
            try:
                await connection.publish(out, timeout_s=max(0.1, deadline - loop.time()))
            except TransportError:
                if not connection.connected:
                    self._lost(connection)  # the reader re-connects; wait for it
                elif loop.time() >= deadline:
                    raise NoReply("the broker did not acknowledge the request in time") from None
            else:
                self.sent += 1
                return

    async def _connect(self) -> MqttConnection:
        connection = MqttConnection(
            self._broker, client_id=self.client_id, timeout_s=self._connect_timeout_s
        )
        await connection.__aenter__()
        try:
            await connection.subscribe([self.reply_topic])
        except BaseException:
            with contextlib.suppress(TransportError):
                await connection.__aexit__(None, None, None)
            raise
        self._connection = connection
        self._connected.set()
        return connection

    def _lost(self, connection: MqttConnection) -> None:
        if self._connection is connection:
            self._connection = None
            self._connected.clear()

    async def _read(self, connection: MqttConnection) -> None:
        """Hand replies to their callers; re-connect when the broker goes away."""
        while True:
            try:
                async for message in connection.messages():
                    self._deliver(message.correlation_data, message.payload)
            except TransportError as exc:
                log.warning("broker connection lost (%s): connecting again", exc)
            self._lost(connection)
            with contextlib.suppress(TransportError):
                await connection.__aexit__(None, None, None)
            connection = await self._reconnect()

    async def _reconnect(self) -> MqttConnection:
        """Until the broker is back (bounded by the caller: closing the client ends it)."""
        attempt = 0
        while True:
            try:
                return await self._connect()
            except TransportError:
                delay_s = RECONNECT_DELAYS_S[min(attempt, len(RECONNECT_DELAYS_S) - 1)]
                attempt += 1
                await asyncio.sleep(delay_s)  # a broker restarting: back off, then retry

    def _deliver(self, correlation: bytes | None, payload: bytes) -> None:
        future = self._pending.get(correlation or b"")
        if future is None or future.done():
            return  # an answer to a call already answered (a late original, a replay)
        try:
            future.set_result(Reply.model_validate_json(payload))
        except ValidationError:
            log.warning("a reply on %s is not a Reply; ignored", self.reply_topic)


async def request(
    broker: BrokerUrl,
    topic: str,
    body: dict[str, Any],
    *,
    reply_prefix: str,
    timeout_s: float,
    retry: Retry = Retry(),
) -> Reply:
    """One call on a connection of its own (what `toolbus call` makes)."""
    async with Client(
        broker, reply_prefix=reply_prefix, retry=retry, connect_timeout_s=min(timeout_s, 10.0)
    ) as client:
        return await client.call(topic, body, timeout_s=timeout_s)
