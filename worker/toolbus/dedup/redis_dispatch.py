"""Store dispatch: competing workers without `$share`, the one that takes a message first.

Brokers without shared subscriptions (ejabberd, RabbitMQ 3.x, aedes) give every worker
every request. With `dispatch = "store"` each worker subscribes to the plain request
topics and asks the shared Redis whether a message is its own to answer: the first to
take the message's key (`SET NX`, a digest of what the publisher sent: topic, payload,
response topic, Correlation Data, user properties, content type) answers it; the others
acknowledge it and drop it, with no reply and no dead letter.

A later copy of the same bytes (the caller's re-send of the same request, a broker's
redelivery) goes to the worker that took the first, for as long as the key lives
(`dedup_ttl_s`): dedup there replays or waits for the run, as behind `$share`. If that
worker is gone (its heartbeat, `{p}:dispatch-alive:{owner}`, lapsed), the next worker to
see a copy takes the key over, and dedup tells the run was cut short (`in_doubt`, or a
rerun for an idempotent tool). Two identical publishes with no id both run, on one worker.
Each worker's heartbeat also scores it in `{p}:dispatch-owners` (a sorted set by beat
time), so the workers alive are read in one range query, never by scanning the keys.
A worker that lost its broker (`offline`) can answer nothing it took: it stops beating,
removes its heartbeat at once and leaves a mark (`{p}:dispatch-left:{owner}`), so a
*re-send* of a call it took is taken over by a worker that can answer it (from dedup's
record, or by waiting for the run), not dropped until the partition heals. A late copy
of the *same publish* is not: the worker that left may be running it (a call without an
id would run twice). Each worker tells the two apart by the digests it has read: a
second copy here that is not the broker's redelivery (DUP) is a re-send. It takes no
message while offline, and `online` beats again before it takes one.

When Redis cannot be reached no worker can know whether another took the message: each
ranks the workers it last saw alive by the message's digest (rendezvous hashing) and only
the first answers (its dedup store is down too: `unavailable`, or a run without dedup
where the operator configured that). A worker that has seen none answers itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections import OrderedDict
from typing import Self

from redis.asyncio import Redis

from toolbus.dedup.redis_connect import connect
from toolbus.wire.messages import Inbound
from toolbus.wire.store_url import key_prefix
from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.dispatch")

HEARTBEAT_S = 2.0
# The digests a worker remembers to tell a re-send from its first copy (about 5 MB); one
# older than that is taken for a first copy, given up by a holder that left only once
# that holder's heartbeat is gone for good.
SEEN_MAX = 32_768
ALIVE_TTL_S = 6.0  # three heartbeats: a slow loop is not taken for a dead worker

# KEYS[1]: the message's key. ARGV: this owner, the key's ttl (ms), the alive prefix, the
# left prefix, 1 when this worker saw the same bytes before (a re-send), else 0.
# 1: taken now; 2: taken before by this owner; 3: taken over from a gone owner; 0: another's.
# A holder that left (lost its broker: `{p}:dispatch-left:{owner}`) gives up only re-sends:
# a copy of the publish it took, read late here, is still its own (it may be running it).
# The alive and left keys are read undeclared: they carry the same hash tag as KEYS[1].
TAKE = """
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then return 2 end
if redis.call('EXISTS', ARGV[3] .. holder) == 1 then return 0 end
if ARGV[5] ~= '1' and redis.call('EXISTS', ARGV[4] .. holder) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 3
"""
TAKEN, MINE, TAKEN_OVER = 1, 2, 3


def digest(message: Inbound) -> str:
    """What the publisher sent, as every subscriber receives it (never what one broker
    connection adds: the packet id, the DUP flag, the arrival time)."""
    h = hashlib.blake2b(digest_size=20)
    for part in (
        message.topic.encode(),
        message.payload,
        (message.response_topic or "").encode(),
        message.correlation_data or b"",
        (message.content_type or "").encode(),
        repr(message.user_properties).encode(),
    ):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


class RedisDispatch:
    """Which worker of those sharing one Redis answers a message."""

    def __init__(
        self, url: str, worker_id: str, *, prefix: str, keep_s: float, timeout_s: float = 5.0
    ) -> None:
        self._redis: Redis = connect(
            url,
            timeout_s=timeout_s,
        )
        self.owner = f"{worker_id}/{uuid.uuid4().hex}"
        self._prefix = key_prefix(url, prefix)
        self._keep_ms = max(1, int(keep_s * 1000))
        self._take = self._redis.register_script(TAKE)
        self.alive: tuple[str, ...] = (self.owner,)  # as the last heartbeat saw them
        self._beating: asyncio.Task[None] | None = None
        self._online = False  # connected to the broker (alive to the others): `online`
        # Digests of the messages read here, newest last: a second copy is a re-send.
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._changed = asyncio.Event()  # wakes the heartbeat when `offline` is called
        self._beats = asyncio.Lock()  # a beat and a leave never cross in Redis
        self.dropped = 0  # messages another worker took
        self.taken_over = 0  # messages whose taker's heartbeat had lapsed

    def _alive_key(self, owner: str) -> str:
        return f"{self._prefix}:dispatch-alive:{owner}"

    def _left_key(self, owner: str) -> str:
        return f"{self._prefix}:dispatch-left:{owner}"

    async def __aenter__(self) -> Self:
        await self._redis.ping()  # fails here, at start-up, when Redis is unreachable
        self._beating = asyncio.create_task(self._beat_on(), name="dispatch-heartbeat")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._beating is not None:
            await cancel_and_wait(self._beating)
        with contextlib.suppress(Exception):  # the key lapses anyway
            await self._redis.delete(self._alive_key(self.owner))
            await self._redis.zrem(f"{self._prefix}:dispatch-owners", self.owner)
        await self._redis.aclose()

    async def _beat(self) -> None:
        now = time.time()
        owners = f"{self._prefix}:dispatch-owners"
        async with self._redis.pipeline(transaction=False) as beat:
            beat.set(self._alive_key(self.owner), "1", px=int(ALIVE_TTL_S * 1000))
            beat.delete(self._left_key(self.owner))
            beat.zadd(owners, {self.owner: now})
            beat.zremrangebyscore(owners, "-inf", now - ALIVE_TTL_S)
            beat.zrangebyscore(owners, now - ALIVE_TTL_S, "+inf")
            *_, alive = await beat.execute()
        names = (a.decode() if isinstance(a, bytes) else str(a) for a in alive)
        self.alive = tuple(sorted({*names, self.owner}))

    async def _beat_on(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # the heartbeat's period, or `offline`
                async with asyncio.timeout(HEARTBEAT_S):
                    await self._changed.wait()
            self._changed.clear()
            try:
                async with self._beats:
                    await (self._beat() if self._online else self._leave())
            except Exception as exc:  # Redis away for a while: the next beat tries again
                log.warning("dispatch heartbeat failed: %s", exc)

    async def _leave(self) -> None:
        async with self._redis.pipeline(transaction=False) as leave:
            leave.set(self._left_key(self.owner), "1", px=self._keep_ms)  # as long as its keys
            leave.delete(self._alive_key(self.owner))
            leave.zrem(f"{self._prefix}:dispatch-owners", self.owner)
            await leave.execute()

    def offline(self) -> None:
        """The broker connection is lost: not alive to the other workers (its heartbeat
        removed now, not left to lapse), so they take over the re-sends of what it took."""
        self._online = False
        self._changed.set()

    async def online(self) -> None:
        """Connected again: alive to the others before any message is taken."""
        self._online = True
        try:
            async with self._beats:
                await self._beat()
        except Exception as exc:  # Redis away: answered by rank meanwhile, as ever
            log.warning("dispatch heartbeat failed: %s", exc)

    async def mine(self, message: Inbound) -> bool:
        """Whether this worker answers `message` (False: another took it; drop it). Not
        while offline: a message read from a connection since lost comes again on the
        session; taking it now would hand it to a worker that cannot answer."""
        if not self._online:
            return False
        key = digest(message)
        # Seen before, and not the broker's redelivery of the same copy: a re-send.
        resend = key in self._seen and not message.redelivered
        self._seen[key] = None
        self._seen.move_to_end(key)
        if len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)
        try:
            taken = await self._take(
                keys=[f"{self._prefix}:dispatch:{key}"],
                args=[
                    self.owner,
                    self._keep_ms,
                    self._alive_key(""),
                    self._left_key(""),
                    int(resend),
                ],
            )
        except Exception as exc:
            first = self._ranked(key)
            log.warning("dispatch store failed (%s): answered by rank, mine: %s", exc, first)
            self.dropped += not first
            return first
        if taken == TAKEN_OVER:
            self.taken_over += 1
            log.info("took over a message whose worker is gone")
        if taken == 0:
            self.dropped += 1
            return False
        return True

    def _ranked(self, key: str) -> bool:
        """Rendezvous hashing over the workers last seen alive: whether this one is first."""

        def rank(owner: str) -> bytes:
            return hashlib.blake2b(f"{key}|{owner}".encode(), digest_size=8).digest()

        return max(self.alive, key=rank) == self.owner
