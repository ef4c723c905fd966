"""Service: the `Worker`. Connect, reconnect, bound concurrency, drain, report status.

Two MQTT v5 connections per worker, reconnected together with jittered exponential
backoff: requests arrive on one (the worker's session and will; it stops reading
while `concurrency` requests wait, see `transport.socket_reader`), replies leave on the
other, whose acknowledgements must come in even then. Requests arrive on a shared
subscription so replicas split the load; each message is handled by the pipeline in
its own named task while at most `concurrency` run at once (the consumer stops taking
messages while every slot is busy). On stop the worker says `stopping`, then
unsubscribes, unless its session is persistent and no other worker is online (then the
broker queues what comes meanwhile for its return: see `handover`), finishes what it
already holds within the grace period, answers anything still running with
`unavailable`, then marks itself offline.

`async with Worker(...)` starts it and returns once it is subscribed; leaving the
block drains it. `run(stop)` is the same for a caller that owns the stop event.
Refused at the first connect for its configuration (the broker's certificate or the
credentials: `BrokerRefused`), the worker stops with that error, since no retry can fix
it; once it has been connected, it retries that like any other loss. So does a broker
without shared subscriptions while the worker needs them (worker/dispatch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Self

from toolbus.calls.inflight import InFlight, Slots
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.observability.metrics import Metrics
from toolbus.tools.registry import Registry
from toolbus.transport import BrokerRefused, MqttConnection, SubscriptionRefused, TransportError
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Inbound
from toolbus.wire.tasks import cancel_and_wait
from toolbus.wire.topics import Topics
from toolbus.worker.cancels import CancelIntake
from toolbus.worker.dispatch import gated
from toolbus.worker.handover import Handover
from toolbus.worker.links import RECONNECT_FIRST_DELAY_S, Links, Takeovers
from toolbus.worker.publisher import ConnectionPublisher
from toolbus.worker.redeliveries import Redeliveries
from toolbus.worker.status import StatusReporter

if TYPE_CHECKING:  # annotations only: importing the mcp SDK costs a second
    from toolbus.backends.mcp import McpBackend

log = logging.getLogger("toolbus.service")

SLOT_LOOK_S = 0.25  # how often a consumer with every slot busy checks its connection
START_TIMEOUT_S = 30.0


class Worker:
    """A worker: the pipeline fed from the broker. Built by `wiring.build_worker`.

    Args:
        broker: where to connect.
        worker_id: the status topic's name, public: not the MQTT client id.
        topics, pipeline, publisher, status, mcp, metrics: the collaborators it drives.
        slots: messages handled at once (`concurrency`), shared with the pipeline, whose
            many-call messages borrow free ones; the consumer waits for a free slot.
        shutdown_grace_s: how long calls may run on after stop is asked.
        publish_timeout_s: the bound on every publish and on unsubscribing.
        reconnect_max_delay_s: the cap on the reconnect backoff.
        links: its two connections as each connect opens them: the secret client ids
            (see `client_ids`), the session's expiry (0: clean sessions), keepalive and
            Maximum Packet Size, and which messages are this worker's (`dispatch`).
    """

    def __init__(
        self,
        *,
        broker: BrokerUrl,
        worker_id: str,
        topics: Topics,
        pipeline: Pipeline,
        publisher: ConnectionPublisher,
        status: StatusReporter,
        mcp: McpBackend,
        metrics: Metrics,
        slots: Slots,
        shutdown_grace_s: float,
        publish_timeout_s: float,
        reconnect_max_delay_s: float,
        links: Links,
    ) -> None:
        self.broker, self.worker_id, self.topics = broker, worker_id, topics
        self.pipeline, self.mcp, self.metrics, self.fleet = pipeline, mcp, metrics, status.fleet
        self._publisher, self._status = publisher, status
        self.cancels = CancelIntake(pipeline, topics, self.fleet)  # on the reply connection
        self._grace_s, self._publish_timeout_s = shutdown_grace_s, publish_timeout_s
        self._reconnect_max_delay_s = reconnect_max_delay_s
        self.client_ids, self._links, self.dispatch = links.ids, links, links.dispatch
        self.subscribed, self.draining = asyncio.Event(), asyncio.Event()  # draining: stopping
        self.redeliveries = Redeliveries(
            gated(self.dispatch, pipeline.handle), publisher, slots.count, links.session_expiry_s
        )
        self.in_flight = InFlight(self.redeliveries.answer, slots, metrics)
        self._conn: MqttConnection | None = None
        self._handover = Handover(status, topics, worker_id, links, publish_timeout_s)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def registry(self) -> Registry:
        return self.pipeline.executor.registry

    def queued(self) -> int:
        """Messages received from the broker and not yet taken (waiting for a slot)."""
        return self._conn.queued() if self._conn is not None else 0

    @property
    def broker_state(self) -> str:
        """`subscribed` (taking requests: ready), `connected`, `disconnected` or `stopping`."""
        if self.draining.is_set():
            return "stopping"
        if self._conn is None or not self._conn.connected:
            return "disconnected"
        return "subscribed" if self.subscribed.is_set() else "connected"

    # -- lifecycle -------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Start serving; return once subscribed (bounded), or raise why not."""
        self._task = asyncio.create_task(self.run(self._stop), name=f"worker:{self.worker_id}")
        subscribed = asyncio.ensure_future(self.subscribed.wait())
        try:
            await asyncio.wait(
                {self._task, subscribed},
                timeout=START_TIMEOUT_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:  # the start itself was cancelled: do not leave it running
            await self.__aexit__(None, None, None)
            raise
        finally:
            subscribed.cancel()
        if self._task.done():
            self._task.result()  # raises what stopped it
        if not self.subscribed.is_set():
            await self.__aexit__(None, None, None)
            raise TimeoutError(f"not subscribed to {self.broker.host} in {START_TIMEOUT_S} s")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._task is not None:
            async with asyncio.timeout(self.stop_bound_s):
                await self._task

    @property
    def stop_bound_s(self) -> float:
        """The longest a stop may take: the grace period, four bounded steps (`stopping`,
        unsubscribe, the late answers, `offline`), then closing the MCP servers."""
        return self._grace_s + 4 * self._publish_timeout_s + self.mcp.close_bound_s

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain and return."""
        log.info(
            "worker %s starting: broker %s, %d local tools, MCP servers: %s",
            self.worker_id,
            self.broker,
            len(self.registry),
            ", ".join(self.mcp.names) or "none",
            extra={"worker_id": self.worker_id, "mcp_servers": self.mcp.names},
        )
        async with self.mcp, self.pipeline, self.dispatch or nullcontext():
            report = asyncio.create_task(
                self.pipeline.executor.report_configuration(), name="report-config"
            )
            try:
                await self._serve(stop)
            finally:
                report.cancel()
        log.info("worker %s stopped", self.worker_id, extra={"handled": self.in_flight.handled})

    async def _serve(self, stop: asyncio.Event) -> None:
        delay_s = RECONNECT_FIRST_DELAY_S
        connected_once = False
        takeovers = Takeovers(self._reconnect_max_delay_s, self.metrics, self.worker_id)
        while not stop.is_set():
            links = self._links.requests(self._status.will()), self._links.replies()
            try:
                async with links[0] as conn, links[1] as out, self._links.joined(conn, self.topics):
                    connected_once = True
                    takeovers.connected()
                    self._conn = conn
                    # Acknowledges what arrives on it; a session not kept forgets the rest.
                    self.redeliveries.connected(conn, resumed=conn.session_present)
                    await _replies_on(out, self._publisher, self.topics)
                    # Taking first: a resumed session's requests come before the SUBACK,
                    # which the request connection reads only as they are taken.
                    consumer = asyncio.create_task(self._consume(conn), name="consume")
                    topics = self.topics.subscriptions()  # no retained request on subscribing
                    await _cancelled_on_error(consumer, conn.subscribe(topics, retained=False))
                    self.subscribed.set()
                    log.info("subscribed to %s", ", ".join(topics), extra={"topics": topics})
                    if not self.draining.is_set():  # online: every status, then the heartbeat
                        self._status.resume(self.in_flight, out)  # and the fleet's watch
                    delay_s = RECONNECT_FIRST_DELAY_S
                    if await _consume_until(consumer, out, stop, self.cancels.received):
                        await self._drain(conn, out)
                        return
            except TransportError as exc:
                if isinstance(exc, BrokerRefused) and not connected_once:
                    raise  # a configuration no retry can fix: say so and stop
                delay_s = takeovers.said(exc, links, delay_s)
            finally:
                await self._status.pause()
                self._conn = None
                self._publisher.detach()
                self.subscribed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s * random.uniform(0.8, 1.2)):  # noqa: S311 -- jitter, not secrecy
                    await stop.wait()
            delay_s = min(delay_s * 2, self._reconnect_max_delay_s)
        # Stopped while disconnected: calls still running get their grace period too.
        await self._finish_handlers()

    async def _consume(
        self, conn: MqttConnection, *, only_queued: bool = False, limit: int | None = None
    ) -> None:
        """Take messages one free slot at a time (slot first: see `InFlight`): only those
        already received with `only_queued`, and at most `limit`."""
        messages = conn.messages()
        while (not only_queued or conn.queued()) and (limit is None or limit > 0):
            limit = None if limit is None else limit - 1
            await _take_slot(self.in_flight, conn)
            try:
                message = await anext(messages)
            except BaseException:
                self.in_flight.release()
                raise
            self.in_flight.start(message)

    async def _drain(self, conn: MqttConnection, out: MqttConnection) -> None:
        """Say `stopping`, stop taking requests (unsubscribed, or the subscription kept:
        `handover`), finish held ones within the grace period, then go offline."""
        await self._begin_stopping()
        deadline = asyncio.get_running_loop().time() + self._grace_s
        log.info("stopping", extra={"in_flight": len(self.in_flight), "grace_s": self._grace_s})
        keep = await self._handover.keep(out, self.in_flight, math.ceil(self.stop_bound_s))
        try:
            if not keep:  # the UNSUBACK comes behind what the broker already sent: take on
                consumer = asyncio.create_task(self._consume(conn), name="consume-draining")
                unsubscribe = conn.unsubscribe(self.topics.subscriptions())
                async with asyncio.timeout(self._publish_timeout_s):
                    await _cancelled_on_error(consumer, unsubscribe)
                await cancel_and_wait(consumer)
            # Requests already received are answered too (ours until acked); kept subscribed,
            # those here now only: more come as answers free the window, and wait for us.
            async with asyncio.timeout_at(deadline):
                await self._consume(conn, only_queued=True, limit=conn.queued() if keep else None)
        except (TransportError, TimeoutError) as exc:
            log.warning("could not take every queued message before stopping: %s", exc)
        await self._finish_handlers(deadline)
        await self._status.stop(self.in_flight)  # each server `stopped`, then `offline`

    async def _begin_stopping(self) -> None:
        self.draining.set()
        self.pipeline.stopping()  # calls cancelled from here on answer `unavailable`
        self._publisher.last_connection()  # no reconnect now: a lost one is lost for good
        await self._status.pause()  # no heartbeat (nor fleet watch: `handover` reads) now

    async def _finish_handlers(self, deadline: float | None = None) -> None:
        """Let running calls finish until the deadline; answer the rest `unavailable`."""
        await self._begin_stopping()
        deadline = deadline or asyncio.get_running_loop().time() + self._grace_s
        await self.in_flight.finish(deadline, self._publish_timeout_s)
        await self.pipeline.drain_tasks(deadline)  # tasks not done by then end failed


async def _take_slot(in_flight: InFlight, conn: MqttConnection) -> None:
    """A free slot; while every slot is busy, a look at the connection now and then.

    Only reading messages would notice a lost connection, and no message is read while
    the slots are full: handlers waiting to publish their replies on the reconnect would
    wait for the consumer, which waits for them.
    """
    if in_flight.any_free():  # the usual case: no timer for a wait that cannot happen
        await in_flight.acquire()
        return
    while True:
        try:
            async with asyncio.timeout(SLOT_LOOK_S):
                await in_flight.acquire()
        except TimeoutError:
            if not conn.connected:
                raise TransportError("connection lost while every slot was busy") from None
        else:
            return


async def _replies_on(out: MqttConnection, publisher: ConnectionPublisher, topics: Topics) -> None:
    """Replies go out on `out`, and cancels come in on it: a plain subscription to every
    cancel (`worker/cancels.py`). A broker whose ACL refuses it (one set up before
    cancels) leaves this worker deaf to cancels, said once per connect, and serving
    calls as before."""
    publisher.attach(out)
    try:
        await out.subscribe([topics.cancels], retained=False)
    except SubscriptionRefused as exc:
        log.warning("cancels will not be heard: %s (docs/topics.md, Cancel)", exc)


async def _consume_until(
    consumer: asyncio.Task[None],
    out: MqttConnection,
    stop: asyncio.Event,
    received: Callable[[Inbound], None],
) -> bool:
    """Consume until stop (True) or until either connection fails (raises). What comes on
    the reply connection (cancels; statuses, when the fleet is watched) goes to `received`."""
    replies_lost = asyncio.create_task(out.lost(received), name="replies-watch")
    stopper = asyncio.create_task(stop.wait(), name="stop-wait")
    done, _ = await asyncio.wait(
        {consumer, replies_lost, stopper}, return_when=asyncio.FIRST_COMPLETED
    )
    if consumer in done:
        replies_lost.cancel()
        stopper.cancel()
        consumer.result()  # re-raises the TransportError
        return False
    await cancel_and_wait(consumer)
    replies_lost.cancel()
    if stopper in done:
        return True
    raise TransportError("the reply connection was lost")


async def _cancelled_on_error(task: asyncio.Task[None], step: Awaitable[None]) -> None:
    """`step`, with `task` running beside it; `task` is cancelled if `step` fails."""
    try:
        await step
    except BaseException:
        await cancel_and_wait(task)
        raise
