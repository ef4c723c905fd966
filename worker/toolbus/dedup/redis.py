"""The Redis dedup store: replicas agree on request ids through one Redis.

The only module that imports `redis` (the `toolbus[redis]` extra). Records are JSON
strings under `{prefix}:dedup:{key}`, written with `SET NX EX` (claim, the call's
fingerprint in it: one round trip) and closed with the reply; closing also publishes
on `{prefix}:dedup-done:{key}` for waiters. Each worker process keeps
`{prefix}:alive:{worker_id}` set to its incarnation, refreshed well within its TTL: a
run whose worker's key is gone, or names another incarnation (the same worker_id
restarted), was cut short by a dead worker.

Records must outlive a Redis restart (`appendonly yes`): a Redis that comes back empty
has forgotten which calls ran, and their repeats run again. That cannot be undone, but
it is not silent: `{prefix}:epoch` is written once (`SET NX`) by the first worker to use
the store; every worker remembers it and reads it with each heartbeat, and on finding it
gone or changed logs one ERROR and calls `on_emptied` (a metric), then adopts the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Self

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from toolbus.dedup.ledger import Bounds
from toolbus.dedup.redis_scripts import FINISH, RELEASE, TAKE_OVER, UNCLAIM
from toolbus.dedup.store import (
    UNKNOWN,
    Claim,
    Done,
    Started,
    StoreUnreachable,
    StoreUnsafe,
    described,
    parse,
)
from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.dedup")

HEARTBEAT_S = 2.0
ALIVE_TTL_S = 6.0  # three heartbeats: a slow loop is not mistaken for a dead worker

RECONNECT_RETRIES = 2  # a lost connection made again, then the command sent again

FAILED_CLAIMS_KEPT = 1_000  # `KeptReplies` asks at once: a few at most, but bounded

# What a finished record costs Redis beyond its key and its JSON: the record's own key
# and entry, and the books' four entries naming it (`redis_scripts.py`), measured with
# `INFO memory` (docs/reliability.md, "Sizing Redis").
REDIS_RECORD_OVERHEAD_BYTES = 600

# Policies under which Redis, at its `maxmemory`, deletes records it holds: a finished
# call's record gone runs its repeat again, another caller's as soon as one's.
_EVICTING = (
    "allkeys-lru allkeys-lfu allkeys-random volatile-lru volatile-lfu volatile-random volatile-ttl"
)


class RedisStore:
    def __init__(
        self,
        url: str,
        worker_id: str,
        *,
        prefix: str,
        timeout_s: float = 5.0,
        bounds: Bounds | None = None,
        on_emptied: Callable[[], None] = lambda: None,
    ) -> None:
        self._redis = aioredis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # A pooled connection a Redis restart cut is found dead only when used: without
            # a retry each one failed one call (`unavailable`), minutes after Redis was back.
            # A lost connection (never a timeout: a command that timed out may have run) is
            # made again and the command sent once more; every command here is safe to
            # repeat (a claim that finds its own record is fresh, the writes compare first).
            retry=Retry(
                ExponentialBackoff(cap=0.5, base=0.05),
                RECONNECT_RETRIES,
                supported_errors=(RedisConnectionError,),  # redis-py adds timeouts by default
            ),
        )
        self._worker_id, self._incarnation = worker_id, uuid.uuid4().hex
        self._prefix = prefix
        self._bounds = bounds or Bounds()
        # EVALSHA, loaded again on NOSCRIPT (a Redis restarted): the scripts are sent once.
        self._take_over = self._redis.register_script(TAKE_OVER)
        self._finish = self._redis.register_script(FINISH)
        self._release = self._redis.register_script(RELEASE)
        self._unclaim = self._redis.register_script(UNCLAIM)
        self._heartbeat: asyncio.Task[None] | None = None
        self._epoch: str | None = None  # the store's, as first seen; None until opened
        self._on_emptied = on_emptied
        # Claims that raised, by key: what each tried to write (`failed_claim`).
        self._failed: dict[str, Started] = {}
        self._held_bytes = 0  # the fleet's books, as the last heartbeat read them
        self._gave_way = {"shrunk": 0, "forgotten": 0}  # by this worker's closes

    def held_bytes(self) -> int:
        return self._held_bytes

    def gave_way(self) -> dict[str, int]:
        return dict(self._gave_way)

    def _key(self, key: str) -> str:
        return f"{self._prefix}:dedup:{key}"

    def _channel(self, key: str) -> str:
        return f"{self._prefix}:dedup-done:{key}"

    def _alive(self, worker_id: str) -> str:
        return f"{self._prefix}:alive:{worker_id}"

    async def __aenter__(self) -> Self:
        where = self._redis.connection_pool.connection_kwargs
        at = f"Redis at {where.get('host')}:{where.get('port')}"  # the URL may hold a password
        try:
            await self._beat()  # fails here, at start-up, when Redis is unreachable
            memory = await self._redis.info("memory")
        except RedisError as exc:
            await self._redis.aclose()
            raise StoreUnreachable(f"cannot reach the dedup store ({at}): {exc}") from None
        try:
            self._check_memory(memory, at)
        except StoreUnsafe:
            await self._redis.aclose()
            raise
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="dedup-heartbeat")
        return self

    def _check_memory(self, memory: dict[str, object], at: str) -> None:
        """Refuse a Redis that evicts records at its `maxmemory` (a finished call's record
        evicted runs its repeat again: another caller's, when one caller fills it); warn
        when its `maxmemory` is below what the bounds let the records take (when full, a
        `noeviction` Redis refuses writes, and every caller's calls get `unavailable`)."""
        limit = int(str(memory.get("maxmemory", 0)))
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if limit and policy in _EVICTING.split():
            raise StoreUnsafe(
                f"the dedup store ({at}) evicts keys at its maxmemory "
                f"(maxmemory-policy {policy}): a call's record evicted would run its repeat "
                "again. Set maxmemory-policy noeviction (docs/reliability.md, Sizing Redis)"
            )
        needed = 2 * self._bounds.max_bytes  # records within the bound, and Redis's own
        if limit and limit < needed:
            log.warning(
                "the dedup store's maxmemory (%d bytes) is below twice dedup_max_bytes (%d): "
                "once full, every call gets unavailable (docs/reliability.md, Sizing Redis)",
                limit,
                self._bounds.max_bytes,
            )

    async def __aexit__(self, *exc: object) -> None:
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
        with contextlib.suppress(Exception):  # a clean stop: nothing of ours runs any more
            await self._redis.delete(self._alive(self._worker_id))
        await self._redis.aclose()

    async def _beat(self) -> None:
        """Say this incarnation lives, and see that the store still has its records: one
        round trip for both."""
        async with self._redis.pipeline(transaction=False) as both:
            both.set(self._alive(self._worker_id), self._incarnation, px=int(ALIVE_TTL_S * 1000))
            both.get(self._epoch_key())
            both.get(f"{self._prefix}:dedup-bytes")
            _, epoch, held = await both.execute()
        self._held_bytes = int(held or 0)
        if self._epoch is None or _text(epoch) != self._epoch:
            await self._check_epoch(_text(epoch))

    def _epoch_key(self) -> str:
        return f"{self._prefix}:epoch"

    async def _check_epoch(self, found: str | None) -> None:
        """Adopt the store's epoch (made now if it has none); a worker that knew another
        one says loudly that the store lost its records."""
        async with self._redis.pipeline(transaction=True) as adopt:
            adopt.set(self._epoch_key(), uuid.uuid4().hex, nx=True)
            adopt.get(self._epoch_key())
            _, current = await adopt.execute()
        known, self._epoch = self._epoch, _text(current)
        if known is None:
            return  # opening: whatever the store has is the start
        log.error(
            "dedup store emptied: its records of earlier calls are gone (Redis restarted "
            "without persistence, or flushed); repeats of calls made before may run again",
            extra={"epoch_was": known, "epoch_found": found, "epoch_now": self._epoch},
        )
        self._on_emptied()

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)  # a period, not a synchronisation
            try:
                await self._beat()
            except Exception as exc:  # Redis away for a moment: keep beating
                log.warning("dedup heartbeat failed: %s", exc)

    def _started(self, fingerprint: str) -> Started:
        return Started(self._worker_id, self._incarnation, time.time(), fingerprint)

    async def claim(self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN) -> Claim:
        started = self._started(fingerprint)
        mine = started.to_json()
        try:
            landed = await self._redis.set(self._key(key), mine, nx=True, px=int(ttl_s * 1000))
        except Exception:
            # Sent, maybe: a stalled Redis runs it once it resumes (`failed_claim`).
            self._failed[key] = started
            if len(self._failed) > FAILED_CLAIMS_KEPT:  # nobody asks (no `KeptReplies`)
                del self._failed[next(iter(self._failed))]
            raise
        if landed:
            return Claim("fresh")
        raw = await self._redis.get(self._key(key))
        if raw is None:  # expired in between: try once more
            return await self.claim(key, ttl_s, fingerprint=fingerprint)
        if _text(raw) == mine:  # our SET went through, its answer lost with the connection
            return Claim("fresh")
        record = parse(raw)
        if isinstance(record, Done):
            return Claim("done", reply=record.reply, fingerprint=record.fingerprint)
        if await self._running(record):
            return Claim("running", started=record, fingerprint=record.fingerprint)
        return Claim("orphaned", started=record, fingerprint=record.fingerprint)

    async def _running(self, record: Started) -> bool:
        """Does the incarnation that started this run still live?"""
        alive = await self._redis.get(self._alive(record.worker_id))
        return _text(alive) == record.incarnation

    async def take_over(
        self, key: str, previous: Started, ttl_s: float, *, fingerprint: str = UNKNOWN
    ) -> bool:
        return await self._replace(key, previous.to_json(), ttl_s, fingerprint)

    async def supersede(self, key: str, previous: Claim, ttl_s: float, *, fingerprint: str) -> bool:
        if previous.reply is None:
            return False  # only a reply is superseded
        seen = Done(previous.reply, previous.fingerprint).to_json()
        return await self._replace(key, seen, ttl_s, fingerprint)

    async def _replace(self, key: str, seen: str, ttl_s: float, fingerprint: str) -> bool:
        mine = self._started(fingerprint).to_json()
        taken = await self._take_over(
            keys=[self._key(key)], args=[seen, mine, int(ttl_s * 1000), key, self._prefix]
        )
        # Taken, or taken by this very call before its answer was lost (a retry): ours.
        return bool(taken) or _text(await self._redis.get(self._key(key))) == mine

    async def finish(
        self,
        key: str,
        reply: bytes,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        summary: bytes | None = None,
    ) -> None:
        done = Done(reply, fingerprint, summary).to_json()
        written = await self._finish(
            keys=[self._key(key)],
            args=[
                *self._mine(fingerprint),
                done,
                int(ttl_s * 1000),
                self._channel(key),
                self._prefix,
                key,
                REDIS_RECORD_OVERHEAD_BYTES,
                int(summary is not None),
                self._bounds.caller_max_bytes,
                self._bounds.max_bytes,
            ],
        )
        if not written:
            log.info("%s is another run's now: its reply is not stored", described(key))
            return
        if isinstance(written, list):  # closed, and how many records gave way to it
            self._gave_way["shrunk"] += int(written[1])
            self._gave_way["forgotten"] += int(written[2])

    async def release(self, key: str, *, fingerprint: str = UNKNOWN) -> None:
        await self._release(
            keys=[self._key(key)], args=[*self._mine(fingerprint), self._channel(key)]
        )

    def failed_claim(self, key: str) -> Started | None:
        return self._failed.pop(key, None)

    async def unclaim(self, key: str, claimed: Started) -> None:
        # Answered is done, deleted or not: the failed claim's SET was in its connection
        # when Redis stalled, and Redis reads that before a command sent after it resumed.
        await self._unclaim(keys=[self._key(key)], args=[claimed.to_json(), self._channel(key)])

    def _mine(self, fingerprint: str) -> tuple[str, str, str]:
        """What names a run of this incarnation's in a record (`_OURS`)."""
        return self._worker_id, self._incarnation, fingerprint

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = UNKNOWN) -> bytes | None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self._channel(key))
            deadline = time.monotonic() + timeout_s
            # Subscribed first, then look: a reply stored in between is not missed.
            while True:
                raw = await self._redis.get(self._key(key))
                if raw is None:
                    return None  # released (or expired): the caller may claim it afresh
                record = parse(raw)
                if record.fingerprint not in (fingerprint, UNKNOWN):
                    return None  # another request's now: the caller decides
                if isinstance(record, Done):
                    return record.reply
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0 or not await self._running(record):
                    return None  # out of time, or its worker died: the caller decides
                # Woken by the reply, or after a heartbeat to see whether the run's worker
                # still lives: a repeat must not wait out its deadline on a dead one.
                await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=min(remaining_s, HEARTBEAT_S)
                )
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
