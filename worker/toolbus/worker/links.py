"""Links: the worker's two broker connections, as opened at each (re)connect, and the
wait a takeover of one calls for.

The request connection carries the worker's session and will; the reply connection
publishes. Each has its own client id (`client_ids`), secret, so no caller can connect
with it; one that does anyway (the secret leaked, a replica started twice) takes the
connection over: the worker reconnects after a wait that grows with each takeover in a
row, so two clients on one id do not ping-pong as fast as the broker lets them.

A cluster's nodes (`broker_url` a list): the first connect goes to the first node, and
each reconnect, after a loss or a refusal, to the next, round the list, with the same
backoff; both connections go to the same node. The worker's status and will are
published anew on each connect, so they land on the node it is on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from toolbus.observability.metrics import Metrics
from toolbus.transport import MqttConnection
from toolbus.transport.nodes import Nodes
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Outbound
from toolbus.wire.topics import Topics
from toolbus.worker.client_ids import ClientIds
from toolbus.worker.dispatch import Dispatch, needs_shares

log = logging.getLogger("toolbus.service")  # the worker's lines, wherever they are made

RECONNECT_FIRST_DELAY_S = 0.5  # doubling up to `reconnect_max_delay_s`

LINKS = ("requests", "replies")  # the worker's two connections, as metrics and logs name them


class Takeovers:
    """Says why the worker's connections went, and how long to wait before the next
    connect. Taken over (another client came with one of our ids): loudly, counted, and
    the wait doubles with each takeover in a row, from the first reconnect delay up to
    the cap; a connection that lasted longer than the cap ends the streak."""

    def __init__(self, max_delay_s: float, metrics: Metrics, worker_id: str) -> None:
        self._max_delay_s, self._metrics, self._worker_id = max_delay_s, metrics, worker_id
        self.streak = 0
        self._since = 0.0

    def connected(self) -> None:
        self._since = time.monotonic()

    def taken_over(self) -> float:
        """One more takeover: the wait it calls for."""
        if time.monotonic() - self._since > self._max_delay_s:
            self.streak = 0
        self.streak += 1
        doubled: float = RECONNECT_FIRST_DELAY_S * 2.0 ** (self.streak - 1)
        return min(doubled, self._max_delay_s)

    def said(
        self, exc: Exception, links: tuple[MqttConnection, MqttConnection], delay_s: float
    ) -> float:
        """Log (and count) why `links` went; the wait before the next connect."""
        taken = [name for name, link in zip(LINKS, links, strict=True) if link.taken_over]
        if not taken:
            log.warning(
                "broker connection lost or refused (%s); retrying in %.1f s",
                exc,
                delay_s,
                extra={"error": str(exc), "retry_in_s": round(delay_s, 3)},
            )
            return delay_s
        delay_s = max(delay_s, self.taken_over())
        for name in taken:
            self._metrics.session_taken_over(name)
        log.error(
            "session taken over",
            extra={
                "connection": ",".join(taken),
                "worker_id": self._worker_id,
                "in_a_row": self.streak,
                "retry_in_s": round(delay_s, 3),
            },
        )
        return delay_s


@dataclass(frozen=True)
class Links:
    """The worker's two connections, opened anew on each (re)connect."""

    nodes: Nodes  # the broker, or a cluster's nodes in the order they are tried
    ids: ClientIds
    concurrency: int
    session_expiry_s: int
    timeout_s: float
    keepalive_s: int
    max_packet_bytes: int | None = None
    dispatch: Dispatch | None = None  # store dispatch; None: the broker's `$share`
    _connects: list[int] = field(default_factory=lambda: [0])  # made so far

    @property
    def broker(self) -> BrokerUrl:
        """The node of the latest connect (the first before any)."""
        return self.nodes.current

    def requests(self, will: Outbound) -> MqttConnection:
        """Where requests arrive: the worker's identity, session and `will` (made at
        each connect: it carries the MCP servers' states of that moment). It holds at
        most `concurrency` requests waiting, whatever the broker sends. Each call is a
        connect: to the next node of a cluster (`replies` goes to the same)."""
        if self._connects[0]:
            self.nodes.advance()  # a reconnect, after a loss or a refusal: the next node
        self._connects[0] += 1
        if len(self.nodes.all) > 1:
            log.info("connecting to %s", self.broker, extra={"broker": str(self.broker)})
        return MqttConnection(
            self.broker,
            client_id=self.ids.requests,
            will=will,
            receive_maximum=self.concurrency,
            hold=self.concurrency,
            manual_ack=True,
            session_expiry_s=self.session_expiry_s,
            max_packet_bytes=self.max_packet_bytes,
            timeout_s=self.timeout_s,
            keepalive_s=self.keepalive_s,
        )

    @asynccontextmanager
    async def joined(self, conn: MqttConnection, topics: Topics) -> AsyncIterator[None]:
        """While `conn` (the request connection, just made) is up: a broker without
        `$share` refused first when the worker needs it, and under store dispatch the
        worker alive to the pool (before it takes a message), offline once it is lost,
        so that the others take over what it took rather than drop it."""
        needs_shares(conn, self.broker, topics)  # before any `$share/` subscription
        if self.dispatch is None:
            yield
            return
        await self.dispatch.online()
        try:
            yield
        finally:
            self.dispatch.offline()

    def replies(self) -> MqttConnection:
        """Where replies leave: the request connection may stop reading (see
        `transport.socket_reader`), and a reply's PUBACK must still come in."""
        return MqttConnection(
            self.broker,
            client_id=self.ids.replies,
            timeout_s=self.timeout_s,
            keepalive_s=self.keepalive_s,
        )
