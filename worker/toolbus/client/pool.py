"""Pool: the workers and MCP servers under one prefix, as their retained statuses say.

`Pool` holds the last status heard on each status topic and forgets one when its MQTT
v5 Message Expiry has passed (the broker drops an expired retained message, but tells
no one already subscribed) or when it is cleared (an empty retained message).
`snapshot` connects, subscribes to `{prefix}/status/#` and returns once the retained
statuses are in: the broker sends them after its SUBACK, and the SUBACK of a second,
later SUBSCRIBE comes behind them (mosquitto); a short quiet period after it covers a
broker that sends them later. `follow` keeps a pool current for a live view.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from toolbus.transport import MqttConnection
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.contracts import ServerStatus, WorkerStatus
from toolbus.wire.messages import Inbound
from toolbus.wire.tasks import cancel_and_wait
from toolbus.wire.topics import Topics

log = logging.getLogger("toolbus.status")

QUIET_S = 0.2  # after the barrier: no new status this long, and the snapshot is taken
QUIET_MAX_S = 1.0  # and at most this long in all, however busy the pool is


@dataclass(frozen=True, slots=True)
class _Heard:
    status: WorkerStatus | ServerStatus
    expires_at: float | None  # time.monotonic(); None: never


class Pool:
    """The last status on each status topic under `topics.prefix`, expired ones gone.

    Args:
        topics: which prefix's statuses, and how their topics read.
        clock: monotonic seconds, to tell when a status expires.
    """

    def __init__(self, topics: Topics, clock: Callable[[], float] = time.monotonic) -> None:
        self._topics, self._clock = topics, clock
        self._heard: dict[str, _Heard] = {}

    def take(self, message: Inbound) -> bool:
        """Hold `message` if it is a status (the newest on its topic); True if held."""
        subject = self._topics.status_of(message.topic)
        if subject is None:
            return False
        if not message.payload:  # a cleared retained status
            return self._heard.pop(message.topic, None) is not None
        model = WorkerStatus if subject[0] == "worker" else ServerStatus
        try:
            status = model.model_validate_json(message.payload)
        except ValidationError:
            log.debug("not a status of this version on %s", message.topic)
            return False
        expires_at = None if message.expiry_s is None else message.received_at + message.expiry_s
        self._heard[message.topic] = _Heard(status, expires_at)
        return True

    def _current(self) -> list[WorkerStatus | ServerStatus]:
        now = self._clock()
        expired = [
            t for t, h in self._heard.items() if h.expires_at is not None and h.expires_at <= now
        ]
        for topic in expired:
            del self._heard[topic]
        return [heard.status for heard in self._heard.values()]

    def workers(self) -> list[WorkerStatus]:
        """Every worker's status, by id."""
        found = [s for s in self._current() if isinstance(s, WorkerStatus)]
        return sorted(found, key=lambda s: s.worker_id)

    def servers(self) -> list[ServerStatus]:
        """Every MCP server's status at each worker serving it, by server then worker."""
        found = [s for s in self._current() if isinstance(s, ServerStatus)]
        return sorted(found, key=lambda s: (s.server, s.worker_id))

    def to_json(self) -> dict[str, Any]:
        """`{"workers": [WorkerStatus...], "servers": [ServerStatus...]}` as JSON values."""
        return {
            "workers": [s.model_dump(mode="json") for s in self.workers()],
            "servers": [s.model_dump(mode="json") for s in self.servers()],
        }


def status_connection(
    broker: BrokerUrl, timeout_s: float, client_id: str | None = None
) -> MqttConnection:
    """A clean session of its own: a status viewer holds nothing across connects.
    `client_id`: the one the broker binds the login to, if it does; else random."""
    return MqttConnection(
        broker,
        client_id=client_id or f"toolbus-status-{uuid.uuid4().hex[:12]}",
        timeout_s=timeout_s,
    )


async def subscribe(conn: MqttConnection, topics: Topics) -> None:
    """Subscribed to every status; returns once the broker has sent the retained ones
    (mosquitto sends them before the SUBACK of the later, empty subscription). QoS 0: a
    status lost in a disconnect is republished by its heartbeat, and QoS 0 messages
    are not held back behind the broker's inflight window, which would let them fall
    behind that SUBACK."""
    await conn.subscribe([topics.statuses], qos=0)
    await conn.subscribe([f"{topics.prefix}/status/.barrier/{uuid.uuid4().hex}"], qos=0)


async def follow(
    conn: MqttConnection, pool: Pool, changed: Callable[[], None] | None = None
) -> None:
    """Hold every status that arrives on `conn` in `pool`, calling `changed` after each
    one held, until the connection fails (`TransportError`)."""
    async for message in conn.messages():
        if pool.take(message) and changed is not None:
            changed()


async def snapshot(
    broker: BrokerUrl, topics: Topics, *, timeout_s: float, client_id: str | None = None
) -> Pool:
    """The statuses retained now; `TransportError` or `TimeoutError` when the broker
    cannot be reached within `timeout_s`, which also bounds the whole wait."""
    pool = Pool(topics)
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with asyncio.timeout_at(deadline):
        conn = status_connection(broker, timeout_s, client_id)
        await conn.__aenter__()
    try:
        async with asyncio.timeout_at(deadline):
            await subscribe(conn, topics)
        heard = asyncio.Event()
        reader = asyncio.create_task(follow(conn, pool, heard.set), name="status-snapshot")
        try:
            # A busy pool's heartbeats never leave a quiet gap: after the barrier the
            # retained statuses are in (mosquitto), so listening on is bounded.
            quiet_until = min(deadline, asyncio.get_running_loop().time() + QUIET_MAX_S)
            await _until_quiet(heard, reader, quiet_until)
        finally:
            await cancel_and_wait(reader, timeout_s)
    finally:
        await conn.__aexit__(None, None, None)
    return pool


async def _until_quiet(heard: asyncio.Event, reader: asyncio.Task[None], deadline: float) -> None:
    """Until nothing was heard for `QUIET_S` (or the deadline); the reader's error, if
    it fails first."""
    loop = asyncio.get_running_loop()
    while True:
        heard.clear()
        wait_s = min(QUIET_S, deadline - loop.time())
        if wait_s <= 0:
            return
        waiting = asyncio.create_task(heard.wait(), name="status-heard")
        done, _ = await asyncio.wait(
            {waiting, reader}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
        )
        waiting.cancel()
        if reader in done:
            reader.result()  # raises what ended it
            return
        if waiting not in done:
            return  # quiet
