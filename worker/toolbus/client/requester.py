"""Requester: one MQTT v5 connection and one private reply topic, for asking and waiting.

A request is published with a private Response Topic, its own Correlation Data, and a
Message Expiry Interval equal to what remains of its deadline, which is how the worker
learns when to stop. When no answer comes within the retry interval it is published
again, byte for byte (the same body, so the same `id`, and the same correlation), up to
`Retry.attempts` sends in all: a worker that died with the request is replaced by one
that gets the repeat, and the workers' deduplication (`dedup_store`) makes sure the tool
runs at most once for it. The first answer that says what became of the request wins;
later ones (a late original, a replay) are dropped.

An answer that says only that its own delivery did not run (`unavailable` for a stalled
dedup store, say) is not yet the request's answer while other copies are unanswered: one
of them may be waiting in a worker's claim and run once the store is back. It is held
(`Said`) and the wait goes on, without sending again, for the other copies' answers, up
to the deadline: a later answer that says more wins; once every copy has said it did not
run, that is true of the request and is the answer; copies still unanswered at the end
leave the outcome unknown (`NoReply`, with the held answer).

The connection is kept and re-made when the broker goes away (a cluster's next node),
so requests made across a broker restart are sent again once it is back; after another
connection took the client id over only after a doubling delay, or never
(`fail_when_taken_over`: `SessionTakenOver`; `takeover`). A request the broker refuses
(its PUBACK's reason code, an ACL's "not authorized") fails at once with
`RequestRefused`. `toolbus.Client` builds on this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar

from toolbus.client.answers import OnProgress, Pending, Said, final
from toolbus.client.refusals import refused
from toolbus.client.takeover import Dropped, Takeovers
from toolbus.transport import (
    MqttConnection,
    SessionTakenOver,
    SubscriptionRefused,
    TransportError,
    publish_refused,
)
from toolbus.transport.nodes import Nodes
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.errors import NoReply
from toolbus.wire.messages import Inbound, Outbound
from toolbus.wire.tasks import cancel_and_wait

__all__ = ["NO_RETRY", "Pending", "Requester", "Retry", "Said", "final"]

log = logging.getLogger("toolbus.client")

RECONNECT_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # then 1 s apart: a broker restarting
# The first connect gives up after this many in a row lost as they were made (`Dropped`).
FIRST_CONNECT_DROPS = 3

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Retry:
    """Send a request again, unchanged, when no answer came within `interval_s`;
    `attempts` sends in all (1: never again)."""

    attempts: int = 3
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.interval_s <= 0:
            raise ValueError("a retry needs at least one attempt and a positive interval")


NO_RETRY = Retry(attempts=1, interval_s=math.inf)


class Requester:
    """`async with Requester(broker, reply_topic=..., client_id=...) as requester`.

    Args:
        broker: where to connect, with credentials and TLS files (a cluster's nodes: `Nodes`).
        reply_topic: where answers come; subscribed once, for the requester's lifetime.
        client_id: the MQTT client identifier.
        retry: when and how often a request is sent again.
        connect_timeout_s: bound on the first connection (and each acknowledgement).
        on_resend: called before each repeat with its send's number and the sends
            allowed (2, 3 for the second of three), e.g. to tell a waiting user.
        watch: more subscriptions on each connection, made after the reply topic's
            (`presence.Presence.subscribe`); `heard` gets what they bring.
        fail_when_taken_over: when another connection takes the client id over (v5 0x8E;
            or a second connection in a row lost at once), fail every request with
            `SessionTakenOver`, connecting no more (a one-off command); by default connect
            again after a doubling delay (`TAKEN_OVER_DELAYS_S`), never in a tight loop.
    """

    def __init__(
        self,
        broker: BrokerUrl | tuple[BrokerUrl, ...],
        *,
        reply_topic: str,
        client_id: str,
        retry: Retry,
        connect_timeout_s: float,
        on_resend: Callable[[int, int], None] | None = None,
        watch: Callable[[MqttConnection], Awaitable[None]] | None = None,
        heard: Callable[[Inbound], None] | None = None,
        fail_when_taken_over: bool = False,
        keepalive_s: int = 60,
    ) -> None:
        self._nodes = Nodes(broker)
        self._takeovers = Takeovers(client_id, fail=fail_when_taken_over)
        self._failed: SessionTakenOver | None = None  # no request can be sent now
        self._watch, self._heard = watch, heard
        self._on_resend, self._retry = on_resend, retry
        self.client_id, self.reply_topic = client_id, reply_topic
        self._connect_timeout_s, self._keepalive_s = connect_timeout_s, keepalive_s
        self._pending: dict[bytes, Pending] = {}
        self.connection: MqttConnection | None = None  # the one up now, if any
        self._connected = asyncio.Event()
        self._closed = False  # after `__aexit__`: no request may wait for a connection
        self._reader: asyncio.Task[None] | None = None
        self.connects = 0  # connections made: 1 unless the broker went away
        self.sent = self.resent = 0  # publishes (first sends and repeats), and repeats

    async def __aenter__(self) -> Self:
        """Connected and subscribed; raises `TransportError` when the broker cannot be
        reached now (later losses are re-connected); `RequestRefused` when it refuses
        the reply topic's subscription (an ACL: no answer could come); `SessionTakenOver`
        when another connection keeps taking the client id over as it connects."""
        while True:
            try:
                first = await self._nodes.first(self._connect)
                break
            except SubscriptionRefused as exc:  # the reply topic's (presence's is caught)
                code = exc.refused[0][1] if exc.refused else 0x80
                what = "the subscription to the reply topic"
                raise refused("SUBACK", code, what, self.reply_topic) from None
            except Dropped as dropped:  # taken over as it was made: as any short-lived one
                await self._again_after(dropped, fail_at=FIRST_CONNECT_DROPS)
        self._reader = asyncio.create_task(self._read(first), name=f"client-{self.client_id}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._connected.set()  # wakes every request waiting to send: each sees the close
        if self._reader is not None:
            await cancel_and_wait(self._reader, self._connect_timeout_s)
        for pending in self._pending.values():
            pending.closed = True  # each waiting request raises `NoReply`
            pending.arrived.set()
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(TransportError):
                await connection.__aexit__(None, None, None)

    async def request(
        self,
        topic: str,
        payload: bytes,
        parse: Callable[[bytes], T],
        *,
        timeout_s: float,
        grace_s: float,
        correlation: bytes,
        ident: str | None,
        judge: Callable[[T], Said] = final,
        on_progress: OnProgress | None = None,
    ) -> T:
        """Publish `payload` and wait for its answer, re-sending it while none comes.

        `timeout_s`: the request's deadline, sent as its expiry (no send after it; the
        worker stops then). `grace_s` more is waited for the worker's own `timeout` at the
        deadline. `parse` reads an answer; one it refuses (`ValueError`) is logged and
        waited past. `judge` says what an answer tells of the request: less than
        `Said.FINAL` is held while copies sent are unanswered (module docstring). `ident`:
        the request's id, if any; `on_progress` gets its progress updates, in order.
        """
        if self._closed:
            raise NoReply("the client is closed", id=ident)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        end = deadline + grace_s
        what = ident or "the request"
        pending = Pending(parse, judge, self._retry.attempts, on_progress=on_progress)
        self._pending[correlation] = pending
        sends, next_send = 0, deadline
        try:
            while True:
                if pending.final is not None:
                    answer: T = pending.final
                    return answer
                if self._failed is not None:
                    raise self._failed
                if pending.closed:
                    raise NoReply("the client closed before an answer came", id=ident)
                if pending.held is not None and pending.answered >= sends:
                    held: T = pending.held  # every copy said it did not run: none did
                    return held
                wake = end
                # Sent again only while nothing came: an answer, even one held, says
                # that a copy reached a worker.
                if pending.held is None and sends < self._retry.attempts:
                    now = loop.time()
                    if now < deadline and (sends == 0 or now >= next_send):
                        if sends:
                            self._resending(sends + 1, what)
                        copy = Outbound(
                            topic=topic,
                            payload=payload,
                            response_topic=self.reply_topic,
                            correlation_data=correlation,
                            # The worker's deadline is ours (whole seconds, rounded up).
                            expiry_s=max(1, math.ceil(deadline - now)),
                        )
                        await self._send(copy, end, ident)
                        sends += 1
                        next_send = loop.time() + self._retry.interval_s
                        continue  # an answer may have come meanwhile
                    if next_send < deadline:
                        wake = min(end, next_send)
                if loop.time() >= end:
                    raise self._unanswered(pending, what, sends, timeout_s + grace_s, ident)
                pending.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(wake):
                        await pending.arrived.wait()
        finally:
            self._pending.pop(correlation, None)

    def _resending(self, send: int, what: str) -> None:
        self.resent += 1
        log.info("no reply to %s yet: sending it again (%d)", what, send)
        if self._on_resend is not None:
            self._on_resend(send, self._retry.attempts)

    def _unanswered(
        self, pending: Pending, what: str, sends: int, waited_s: float, ident: str | None
    ) -> NoReply:
        if pending.held is None:
            return NoReply(
                f"no reply to {what} on {self.reply_topic} within {waited_s:g} s", id=ident
            )
        return NoReply(
            f"{pending.answered} of {sends} copies of {what} were answered that they did not "
            f"run, the others not within {waited_s:g} s: one of them may have run",
            id=ident,
            answer=pending.held,
            sends=sends,
            answered=pending.answered,
        )

    async def _send(self, out: Outbound, deadline: float, ident: str | None) -> None:
        """Publish once the connection is up; across a broker restart, once it is back."""
        loop = asyncio.get_running_loop()
        while True:  # checked each turn: a publish cut short by the close comes back here
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise NoReply("the client closed before the request was sent", id=ident)
            try:
                async with asyncio.timeout_at(deadline):
                    await self._connected.wait()
            except TimeoutError:
                raise NoReply("the broker connection did not come back in time", id=ident) from None
            connection = self.connection
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise NoReply("the client closed before the request was sent", id=ident)
            if connection is None:
                continue
            try:
                code = await connection.publish(out, timeout_s=max(0.1, deadline - loop.time()))
            except TransportError:
                if not connection.connected:
                    self._lost(connection)  # the reader re-connects; wait for it
                elif loop.time() >= deadline:
                    raise NoReply(
                        "the broker did not acknowledge the request in time", id=ident
                    ) from None
            else:
                self.sent += 1
                if publish_refused(code):  # an ACL's refusal: a repeat is refused alike
                    raise refused("PUBACK", code, "to take the request on", out.topic)
                return

    async def _connect(self) -> MqttConnection:
        connection = MqttConnection(
            self._nodes.current,
            client_id=self.client_id,
            timeout_s=self._connect_timeout_s,
            keepalive_s=self._keepalive_s,  # a node that stalls is left after about twice this
        )
        await connection.__aenter__()
        try:
            await connection.subscribe([self.reply_topic])
            if self._watch is not None:
                await self._watch(connection)
        except BaseException as exc:
            lost = connection.taken_over or not connection.connected  # not a stall
            with contextlib.suppress(TransportError):
                await connection.__aexit__(None, None, None)
            if (
                lost
                and isinstance(exc, TransportError)
                and not isinstance(exc, SubscriptionRefused)
            ):
                raise Dropped(exc, taken_over=connection.taken_over) from exc
            raise
        self.connects += 1
        self.connection = connection
        self._connected.set()
        return connection

    def _lost(self, connection: MqttConnection) -> None:
        self._nodes.advance()  # its node is lost: the next connect goes to the next
        if self.connection is connection and not self._closed:
            self.connection = None
            self._connected.clear()

    async def _read(self, connection: MqttConnection) -> None:
        """Hand answers to their requests; re-connect when the broker goes away."""
        loop = asyncio.get_running_loop()
        while True:
            made = loop.time()
            try:
                async for message in connection.messages():
                    if message.topic != self.reply_topic and self._heard is not None:
                        self._heard(message)
                    else:
                        self._deliver(message.correlation_data, message.payload)
            except TransportError as exc:
                if not connection.taken_over:
                    log.warning("broker connection lost (%s): connecting again", exc)
            self._lost(connection)
            with contextlib.suppress(TransportError):
                await connection.__aexit__(None, None, None)
            if await self._after_loss(connection.taken_over, loop.time() - made) is not None:
                return
            try:
                connection = await self._reconnect()
            except SessionTakenOver:
                return  # taken over again while connecting: the requests fail with it

    async def _after_loss(
        self, taken_over: bool, lived_s: float, *, fail_at: int | None = None
    ) -> SessionTakenOver | None:
        """After a lost connection: the error when the requests fail now, else None once
        it is time to connect again: at once after a broker restart, after a doubling
        delay when taken over (`takeover`)."""
        delay_s = self._takeovers.after_loss(taken_over, lived_s, fail_at=fail_at)
        if isinstance(delay_s, SessionTakenOver):
            self._failed = delay_s
            self._connected.set()  # wakes every request waiting to send: each sees it
            for pending in self._pending.values():
                pending.arrived.set()  # and every one waiting for an answer
            return delay_s
        await asyncio.sleep(delay_s)
        return None

    async def _reconnect(self) -> MqttConnection:
        """Until the broker is back (bounded by the owner: closing the requester ends it)."""
        attempt = 0
        while True:
            try:
                return await self._connect()
            except Dropped as dropped:
                self._nodes.advance()  # lost as a connection is: the next node, if any
                await self._again_after(dropped)
            except TransportError:
                self._nodes.advance()  # this node does not answer: the next, after a pause
                delay_s = RECONNECT_DELAYS_S[min(attempt, len(RECONNECT_DELAYS_S) - 1)]
                attempt += 1
                await asyncio.sleep(delay_s)  # a broker restarting: back off, then retry

    async def _again_after(self, dropped: Dropped, *, fail_at: int | None = None) -> None:
        """After a connection lost as it was made: the delay, or `SessionTakenOver`."""
        if (failed := await self._after_loss(dropped.taken_over, 0.0, fail_at=fail_at)) is not None:
            raise failed from dropped

    def _deliver(self, correlation: bytes | None, payload: bytes) -> None:
        pending = self._pending.get(correlation or b"")
        if pending is None:
            return  # an answer to a request already answered (a late original, a replay)
        try:
            pending.take(payload)
        except (ValueError, RecursionError):  # pydantic's ValidationError too; deep JSON
            log.warning("an answer on %s is not one we can read; ignored", self.reply_topic)
