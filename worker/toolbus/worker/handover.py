"""Handover: at a clean stop, keep the request subscription or give it up.

A worker that unsubscribes as it stops tells the broker to send it nothing more: with
no other member of the pool subscribed, the broker then drops every request published
until one is back (a message no subscription matches is not kept anywhere). A
persistent session (a stable `worker_id`, `session_expiry_s` > 0) that keeps its
subscription across the disconnect has the broker queue them instead, and the same
`worker_id` receives them when it returns, as after a crash. But mosquitto queues to a
kept shared subscription (`$share/...`) of an offline session while other members are
online too: it takes the group's sessions in turn, online or not, so a stopped member
that kept it would hold every other request until it returns
(tests/worker/test_clean_restart.py shows both). Hence the rule: keep the subscription
only when no other member is online to take the calls.

The other members are known from their retained statuses (`{prefix}/status/workers/+`).
Members stopping at the same moment (`toolbus serve --processes N` stopping all its
children, two replicas stopped together) are settled by order: each first publishes
its own `stopping` status and waits until the broker has taken it, and only then reads
the others'. Of the members stopping together, the one whose `stopping` reached the
broker last reads every other one's `stopping` (they came before its own, which came
before its read), sees no member online and keeps the subscription: at least one keeps
it. Several may; each then holds what the broker queues to it until it returns.
Whenever the answer is unknown (its `stopping` not acknowledged, the statuses not read
in time) the subscription is kept: a request may wait for this worker, none is lost.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from pydantic import ValidationError

from toolbus.transport import MqttConnection, TransportError
from toolbus.wire.contracts import WorkerStatus
from toolbus.wire.topics import Topics
from toolbus.worker.links import Links
from toolbus.worker.status import Counts, StatusReporter

log = logging.getLogger("toolbus.service")


class Handover:
    """Decides, as the worker stops, whether it keeps its request subscription.

    Args:
        status: publishes this worker's `stopping` status.
        topics: where the statuses are.
        worker_id: this worker's id (its own status is not another's).
        links: the worker's connections: their session's expiry (0: a clean session,
            nothing to keep).
        timeout_s: the bound on publishing `stopping` and reading the others together.
    """

    def __init__(
        self, status: StatusReporter, topics: Topics, worker_id: str, links: Links, timeout_s: float
    ) -> None:
        self._status, self._topics, self._worker_id = status, topics, worker_id
        self._session_expiry_s, self._timeout_s = links.session_expiry_s, timeout_s

    async def keep(self, statuses: MqttConnection, counts: Counts, lasts_s: int) -> bool:
        """Publish this worker's `stopping` (expiring after `lasts_s`), then decide: True
        to keep the subscription (a persistent session, and no other worker online, or
        not known), False to unsubscribe. `statuses`: a live connection whose messages
        nothing else reads (the worker's reply connection), to read the others' on."""
        worker_id, unknown = self._worker_id, "the broker did not acknowledge `stopping`"
        others: list[str] | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                published = await self._status.stopping(counts, lasts_s)
                if not self._session_expiry_s:
                    log.info(
                        "stopping without a persistent session: nothing to keep; requests "
                        "published while no worker is subscribed are dropped by the broker "
                        "(set worker_id and a client id secret to keep them)",
                        extra={"worker_id": worker_id},
                    )
                    return False
                if published:
                    others = await online_workers(statuses, self._topics, worker_id)
        except (TransportError, TimeoutError) as exc:
            unknown = str(exc) or f"no answer within {self._timeout_s:g} s"
        if others is None:
            log.warning(
                "stopping: could not tell whether another worker is online (%s); keeping "
                "the subscription, so requests published meanwhile wait in this worker's "
                "session",
                unknown,
                extra={"worker_id": worker_id},
            )
            return True
        if others:
            log.info(
                "stopping: unsubscribing, other workers online take the requests",
                extra={"worker_id": worker_id, "online": others},
            )
            return False
        log.info(
            "stopping: no other worker online; the subscription is kept, so the broker "
            "queues requests published meanwhile in this worker's session for its return "
            "under the same worker_id (within session_expiry_s)",
            extra={"worker_id": worker_id, "session_expiry_s": self._session_expiry_s},
        )
        return True


async def online_workers(conn: MqttConnection, topics: Topics, worker_id: str) -> list[str]:
    """The ids of the other workers whose retained status says `online`, read on `conn`.

    Subscribed at QoS 0 (a QoS 1 retained message may wait behind the broker's inflight
    window); mosquitto sends a subscription's retained messages before it answers a
    later SUBSCRIBE, so once the second, empty subscription is acknowledged they are
    all in, and read without waiting. A status of another version (unreadable) is not
    counted as online: in doubt, the subscription is kept.
    """
    await conn.subscribe([topics.status("+")], qos=0)
    await conn.subscribe([f"{topics.prefix}/status/.barrier/{uuid.uuid4().hex}"], qos=0)
    latest: dict[str, str] = {}
    messages = conn.messages()
    for _ in range(conn.queued()):  # queued: no wait
        message = await anext(messages)
        subject = topics.status_of(message.topic)
        if subject is None or subject[0] != "worker" or subject[1] == worker_id:
            continue
        try:
            state = WorkerStatus.model_validate_json(message.payload).state
        except ValidationError:  # a cleared status (empty), or another version's
            state = "offline"
        latest[subject[1]] = state  # the newest on each topic wins
    return sorted(other for other, state in latest.items() if state == "online")
