"""Fleet: the other workers, as their retained statuses say, for the status page.

Only a worker whose HTTP listener is on watches (`http_port`). While it is connected,
its reply connection is subscribed at QoS 0 to every worker's status, and what arrives
there (`MqttConnection.lost` reads it: the connection's one reader until a clean stop,
when `handover` reads the same statuses) is kept, the newest of each. The statuses are
retained, so a worker that connects later sees the fleet at once; the heartbeat
republishes them, so the view stays live. The watch ends as the worker begins to stop,
before `handover` subscribes again, and at every disconnect.

Bounded: at most `MAX_WORKERS` workers (the least recently heard of gives way), and a
worker not heard of for `stale_after_s` (the statuses' own Message Expiry) is dropped,
as the broker drops its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from toolbus.wire.contracts import WorkerStatus
from toolbus.wire.messages import Inbound
from toolbus.wire.tasks import cancel_and_wait
from toolbus.wire.topics import Topics

if TYPE_CHECKING:  # the transport imports aiomqtt: not for `toolbus mappings` (wiring)
    from toolbus.transport import MqttConnection

log = logging.getLogger("toolbus.service")

MAX_WORKERS = 256
# A real status is a few hundred bytes per MCP server; anything larger is not a worker's,
# and kept 256 times it would be what a status publisher can pin in this worker.
MAX_STATUS_BYTES = 64 * 1024
STOP_BOUND_S = 2.0


class Fleet:
    """The workers seen through their retained statuses (this one's included).

    Args:
        topics: where the statuses are.
        stale_after_s: a worker not heard of this long is forgotten.
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        topics: Topics,
        *,
        stale_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._topics, self._stale_after_s, self._clock = topics, stale_after_s, clock
        self._seen: dict[str, tuple[float, WorkerStatus]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, conn: MqttConnection) -> None:
        """Subscribe `conn` to the statuses in the background; what comes on it goes to
        `received` until `unwatch`."""
        self._task = asyncio.create_task(self._subscribe(conn), name="fleet-watch")
        self._task.add_done_callback(_report_end)

    async def unwatch(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task, STOP_BOUND_S)
            self._task = None

    async def _subscribe(self, conn: MqttConnection) -> None:
        from toolbus.transport import TransportError  # noqa: PLC0415 -- see TYPE_CHECKING

        try:
            await conn.subscribe([self._topics.status("+")], qos=0)
        except TransportError as exc:
            if conn.connected:  # refused (an ACL): the page shows this worker alone
                log.warning("the status page cannot read the other workers' statuses: %s", exc)

    def received(self, message: Inbound) -> None:
        """A message on the watched connection (only statuses are subscribed there)."""
        if self._task is not None:
            self.heard(message.topic, message.payload)

    def heard(self, topic: str, payload: bytes) -> None:
        """One status message: the newest for its worker; an empty one clears it."""
        subject = self._topics.status_of(topic)
        if subject is None or subject[0] != "worker":
            return
        worker_id = subject[1]
        if not payload:
            self._seen.pop(worker_id, None)
            return
        if len(payload) > MAX_STATUS_BYTES:
            return  # not shown, and not kept (the bound above)
        with contextlib.suppress(ValidationError):  # another version's: not shown
            status = WorkerStatus.model_validate_json(payload)
            self._seen.pop(worker_id, None)  # re-inserted last: the most recently heard
            self._seen[worker_id] = (self._clock(), status)
            while len(self._seen) > MAX_WORKERS:
                del self._seen[next(iter(self._seen))]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every worker heard of recently: id, state, since, version, in flight, handled,
        servers, seconds since heard of."""
        now = self._clock()
        for worker_id in [w for w, (at, _) in self._seen.items() if now - at > self._stale_after_s]:
            del self._seen[worker_id]
        return [
            {
                "worker_id": status.worker_id,
                "state": status.state,
                "since": status.since.isoformat() if status.since else None,
                "version": status.version,
                "in_flight": status.in_flight,
                "tasks": status.tasks,
                "waiting": status.waiting,
                "handled": status.handled,
                "servers": {name: s.state for name, s in status.servers.items()},
                "heard_s_ago": round(now - at, 1),
            }
            for worker_id, (at, status) in sorted(self._seen.items())
        ]


def _report_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("the status page's fleet watch stopped: %r", error, exc_info=error)
