"""Status: the worker's and each MCP server's state, as retained messages that stay true.

`{prefix}/status/workers/{worker_id}` says online/offline, since when, the requests in
flight and handled, and every server's state; `{prefix}/status/servers/{server}/{worker_id}`
carries one server's state, last error and tool count as this worker sees it. Both are
retained, so a dashboard (or `toolbus status`) that subscribes later sees them at once.

What keeps them true:
- a heartbeat: every status is republished every `interval_s` with an MQTT v5 Message
  Expiry of `EXPIRY_INTERVALS` intervals, so the statuses of a worker that vanished
  without its will (a broker restarted without persistence meanwhile, a partition) expire
  instead of piling up;
- the heartbeat starts with every connect, so a broker that lost its retained messages
  has them back at once;
- a clean stop publishes the worker's `stopping` as it begins, then each server's
  final state (`stopped`) and the worker's `offline`, expiring like the heartbeat's;
- the last will (`offline`, `since` null) expires after `offline_expiry_s`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, Protocol

from toolbus.wire.contracts import McpServerState, ServerStatus, ServerSummary, WorkerStatus
from toolbus.wire.messages import Outbound, Publisher
from toolbus.wire.tasks import cancel_and_wait
from toolbus.wire.topics import Topics
from toolbus.worker.fleet import Fleet

if TYPE_CHECKING:  # annotations only: importing the mcp SDK costs a second
    from toolbus.backends.mcp import McpServer
    from toolbus.transport import MqttConnection

log = logging.getLogger("toolbus.service")

EXPIRY_INTERVALS = 3  # a status outlives its last heartbeat this many intervals
PAUSE_BOUND_S = 5.0  # the heartbeat ends at its next await; this only bounds a bug


class Counts(Protocol):
    """The worker's request counts (`InFlight` has them)."""

    @property
    def count(self) -> int:
        """Requests being handled now."""

    @property
    def handled(self) -> int:
        """Requests handled since the start."""


def status_expiry_s(interval_s: float) -> int:
    """A status's Message Expiry: `EXPIRY_INTERVALS` heartbeats."""
    return max(1, math.ceil(EXPIRY_INTERVALS * interval_s))


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Server:
    """What the reporter knows of one MCP server."""

    state: McpServerState = "connecting"
    since: datetime = field(default_factory=utc_now)
    last_error: str | None = None
    tool_count: int = 0
    bad_stdout_lines: int = 0
    source: McpServer | None = None  # read again at each heartbeat: tools change in place


class StatusReporter:
    """Publishes the worker's and its MCP servers' statuses while the worker is up.

    Args:
        topics: where status topics live.
        worker_id: this worker's id (public: not its MQTT client ids, see `client_ids`).
        publisher: where statuses are published.
        servers: the MCP servers to report, `connecting` until they say otherwise.
        interval_s: the heartbeat: every status is published again this often.
        offline_expiry_s: how long the broker keeps the last will (`offline`) of a
            worker that crashed: statuses of workers that never return expire.
        version: the toolbus release the worker runs, in every worker status (the will's
            too), so an operator sees which replicas a rolling upgrade has reached.
        clock: the time a state began (UTC).
        fleet: the other workers' statuses (the status page's), watched on the reply
            connection from `resume` to `pause`; None: not watched.
    """

    def __init__(
        self,
        topics: Topics,
        worker_id: str,
        publisher: Publisher,
        servers: Iterable[str],
        *,
        interval_s: float,
        offline_expiry_s: int = 3600,
        version: str | None = None,
        clock: Callable[[], datetime] = utc_now,
        fleet: Fleet | None = None,
    ) -> None:
        self.fleet = fleet
        self._topics, self._worker_id, self._publisher = topics, worker_id, publisher
        self._version = version
        self._interval_s, self._offline_expiry_s, self._clock = interval_s, offline_expiry_s, clock
        self.expiry_s = status_expiry_s(interval_s)
        self._servers = {name: _Server(since=clock()) for name in servers}
        self._counts: Counts | None = None  # set while live: connected and not stopping
        self._online_since = clock()
        self._handled_before = 0  # for the will: what a crash would leave to say
        self._heartbeat: asyncio.Task[None] | None = None
        self.tasks: Callable[[], int] = lambda: 0  # the pipeline's, once built (wiring)
        self.waiting: Callable[[], int] = lambda: 0  # held calls (calls/rounds.py), likewise
        self.node: Callable[[], str | None] = lambda: None  # the broker node now (wiring)
        self._changes: set[asyncio.Task[None]] = set()

    # -- the worker's lifecycle ----------------------------------------------------

    def will(self) -> Outbound:
        """The last will for the next connection: `offline`, since unknown."""
        status = WorkerStatus(
            state="offline",
            worker_id=self._worker_id,
            handled=self._handled_before,
            version=self._version,
        )
        return self._worker_message(status, self._offline_expiry_s)

    def resume(self, counts: Counts, replies: MqttConnection | None = None) -> None:
        """Connected and subscribed: every status now and every `interval_s` (the
        heartbeat), and each server change as it happens, until `pause`; the fleet
        watched on `replies` meanwhile."""
        if self.fleet is not None and replies is not None:
            self.fleet.watch(replies)
        self._counts = counts
        self._online_since = self._clock()
        self._heartbeat = asyncio.create_task(self._beat(), name=f"status:{self._worker_id}")

    async def pause(self) -> None:
        """Disconnected or stopping: nothing more is published; server changes are kept
        for the next `resume` (or `stop`)."""
        if self._counts is not None:
            self._handled_before = self._counts.handled
        self._counts = None
        for task in [t for t in (self._heartbeat, *self._changes) if t is not None]:
            await cancel_and_wait(task, PAUSE_BOUND_S)
        if self.fleet is not None:  # before `handover` reads the reply connection
            await self.fleet.unwatch()
        self._heartbeat = None

    async def stopping(self, counts: Counts, lasts_s: int) -> bool:
        """A clean stop has begun (after `pause`): the worker's `stopping` status,
        expiring after `lasts_s` (at least the heartbeat's), which the other workers
        read to decide which of them keeps the subscription (`handover`). True once the
        broker has acknowledged it."""
        status = self._worker_status("stopping", self._clock(), counts)
        message = self._worker_message(status, max(self.expiry_s, lasts_s))
        return await self._publisher.publish(message) is None

    async def stop(self, counts: Counts) -> None:
        """A clean stop: each server's final state (`stopped`) and the worker's
        `offline`, published at once (one publish bound for all), expiring like the
        heartbeat's so that a worker that left on purpose leaves nothing behind."""
        now = self._clock()
        for server in self._servers.values():
            server.state, server.since = "stopped", now
        messages = [self._server_message(name) for name in self._servers]
        offline = self._worker_status("offline", now, counts)
        messages.append(self._worker_message(offline, self.expiry_s))
        await asyncio.gather(*(self._publisher.publish(m) for m in messages))

    # -- MCP servers ---------------------------------------------------------------

    def server_changed(self, server: McpServer) -> None:
        """A backend listener: log the change, publish it in the background when live."""
        log.info(
            "mcp server state",
            extra={"server": server.name, "state": server.state, "error": server.last_error},
        )
        known = self._servers.setdefault(server.name, _Server(since=self._clock()))
        if server.state != known.state:
            known.since = self._clock()
        known.state, known.last_error = server.state, server.last_error
        known.source = server
        if self._counts is None:
            return
        task = asyncio.create_task(self._publish_change(server.name), name=f"status:{server.name}")
        self._changes.add(task)
        task.add_done_callback(self._changes.discard)

    # -- publishing ----------------------------------------------------------------

    async def _beat(self) -> None:
        while True:
            for name in self._servers:
                await self._publisher.publish(self._server_message(name))
            await self._publish_worker()
            await asyncio.sleep(self._interval_s)

    async def _publish_change(self, name: str) -> None:
        await self._publisher.publish(self._server_message(name))
        await self._publish_worker()

    async def _publish_worker(self) -> None:
        if (counts := self._counts) is not None:
            status = self._worker_status("online", self._online_since, counts)
            await self._publisher.publish(self._worker_message(status, self.expiry_s))

    def _worker_status(
        self, state: Literal["online", "stopping", "offline"], since: datetime, counts: Counts
    ) -> WorkerStatus:
        return WorkerStatus(
            state=state,
            worker_id=self._worker_id,
            since=since,
            in_flight=counts.count,
            tasks=self.tasks(),
            waiting=self.waiting(),
            handled=counts.handled,
            servers={
                name: ServerSummary(state=s.state, last_error=s.last_error)
                for name, s in self._servers.items()
            },
            version=self._version,
            broker=self.node(),
        )

    def _worker_message(self, status: WorkerStatus, expiry_s: int) -> Outbound:
        return Outbound(
            topic=self._topics.status(self._worker_id),
            payload=status.model_dump_json().encode(),
            retain=True,
            expiry_s=expiry_s,
        )

    def _server_message(self, name: str) -> Outbound:
        server = self._servers[name]
        if server.source is not None:  # a re-list changes the tools, not the state
            server.tool_count = len(server.source.tool_names)
            server.bad_stdout_lines = server.source.bad_stdout_lines
        status = ServerStatus(
            server=name,
            state=server.state,
            worker_id=self._worker_id,
            since=server.since,
            last_error=server.last_error,
            tool_count=server.tool_count,
            bad_stdout_lines=server.bad_stdout_lines,
            protocol_version=server.source.protocol_version if server.source else None,
        )
        return Outbound(
            topic=self._topics.server_status(name, self._worker_id),
            payload=status.model_dump_json().encode(),
            retain=True,
            expiry_s=self.expiry_s,
        )
