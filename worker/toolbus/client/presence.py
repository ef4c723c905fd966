"""Presence: whether the workers' retained statuses say any worker is online, before a
request is sent (`toolbus.Client(require_worker=True)`, which `toolbus call` and `toolbus
tools` use).

Every worker keeps a retained status on `{prefix}/status/workers/{worker_id}`: `online`
while it takes requests, `stopping`/`offline` (its last will too) when it does not, and
nothing once an offline status has expired. The client's own connection subscribes to
them beside its reply topic (one connection: a broker that binds the login to one
client id allows no second), then to a barrier topic whose SUBACK comes behind the
retained statuses (mosquitto; see `pool.subscribe`).

`check` decides, within about a second of connecting:

- a worker `online`: go on (a status we cannot read, from another version, too: we
  cannot tell, so the request is sent and waited for as before);
- a worker coming back: `stopping` (a rolling restart: the old replica stops, the new
  one is not yet online), or `offline` since less than `RESTARTING_S` by its own clock
  (a clean stop, then a restart): go on, the request's re-sends ride the restart out
  (its persistent session may hold the request for it, too);
- none online, or no worker status at all (no worker has run here lately: a stopped
  one's `offline` expires after three status intervals; or a broker that keeps no
  retained messages, or a login that may not read the statuses): wait `GRACE_S` more
  for one coming online now (a worker connecting publishes `online` at once), then
  raise `NoWorker`: the request is not sent, so it cannot run later;
- the subscription refused by the broker (SUBACK 0x80 and above): unknown, go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime

from toolbus.client.pool import QUIET_MAX_S, QUIET_S, Pool
from toolbus.transport import MqttConnection, SubscriptionRefused
from toolbus.wire.errors import NoWorker
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import Topics

GRACE_S = 0.3  # after the retained statuses are in: a worker connecting right now
# A clean stop's `offline` this recent is likely a restart (compose, systemd, a rolling
# update): the calls' re-sends (3 sends, 5 s apart by default) ride it out.
RESTARTING_S = 15.0


class Presence:
    """The worker statuses heard on the client's connection, and `check` on them."""

    def __init__(self, topics: Topics) -> None:
        self._topics = topics
        self._pool = Pool(topics)
        self._changed = asyncio.Event()
        self._subscribed_at: float | None = None  # loop time the barrier's SUBACK came
        self._last_heard = 0.0
        self._unreadable = False  # a worker status of a shape we do not know
        self._refused = False  # the broker refused the subscription: we cannot tell

    @property
    def filters(self) -> list[str]:
        return [f"{self._topics.prefix}/status/workers/+"]

    async def subscribe(self, conn: MqttConnection) -> None:
        """Subscribed to the worker statuses, the retained ones sent (see the module)."""
        try:
            await conn.subscribe(self.filters, qos=0)
            barrier = f"{self._topics.prefix}/status/.barrier/{uuid.uuid4().hex}"
            await conn.subscribe([barrier], qos=0)
        except SubscriptionRefused:
            self._refused = True  # refused by an ACL: the statuses cannot say
        # Any other `TransportError` (lost, taken over, no SUBACK in time) is raised: the
        # requester connects again (a taken-over connection still reads as connected).
        self._subscribed_at = asyncio.get_running_loop().time()
        self._changed.set()

    def take(self, message: Inbound) -> None:
        """A message on a status topic (the connection's other messages are replies)."""
        if self._topics.status_of(message.topic) is None:
            return
        if not self._pool.take(message) and message.payload:
            self._unreadable = True
        self._last_heard = asyncio.get_running_loop().time()
        self._changed.set()

    def online(self) -> list[str]:
        """The ids of the workers whose status says `online` now."""
        return [s.worker_id for s in self._pool.workers() if s.state == "online"]

    def coming_back(self) -> list[str]:
        """The ids of the workers that look restarting: `stopping`, or `offline` since
        less than `RESTARTING_S` (not the last will's: it says no time)."""
        now = datetime.now(UTC)
        return [
            s.worker_id
            for s in self._pool.workers()
            if s.state == "stopping"
            or (
                s.state == "offline"
                and s.since is not None
                and (now - _aware(s.since)).total_seconds() < RESTARTING_S
            )
        ]

    async def check(self) -> None:
        """Return once a worker is online (or coming back), or it cannot be told;
        `NoWorker` when the statuses say none is (bounded: about `QUIET_MAX_S +
        GRACE_S` after subscribing)."""
        loop = asyncio.get_running_loop()
        settled: float | None = None
        while True:
            if self._refused or self._unreadable or self._subscribed_at is None:
                return  # cannot tell (never subscribed: not connected through the requester)
            if self.online() or self.coming_back():
                return
            now = loop.time()
            # In: nothing heard for QUIET_S after the barrier (or QUIET_MAX_S in all).
            quiet_at = max(self._subscribed_at, self._last_heard) + QUIET_S
            in_at = min(quiet_at, self._subscribed_at + QUIET_MAX_S)
            if settled is None and now >= in_at:
                settled = now
            if settled is not None and now >= settled + GRACE_S:
                raise self._no_worker()
            wake = settled + GRACE_S if settled is not None else in_at
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(wake):
                    await self._changed.wait()

    def _no_worker(self) -> NoWorker:
        where = f"{self._topics.prefix}/status/workers/"
        workers = self._pool.workers()
        if workers:
            states = ", ".join(f"{s.worker_id} {s.state}" for s in workers)
            return NoWorker(f"no worker online under {where} ({states})", workers=len(workers))
        return NoWorker(
            f"no worker online: none has a status under {where} (none ran on this broker "
            "lately, or this login may not read the statuses)",
            workers=0,
        )


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
