"""The Redis dedup store: replicas agree on request ids through one Redis.

With `redis_fleet.py` and `redis_scripts.py`, the only modules that import `redis` (the
`toolbus[redis]` extra). Records are JSON strings under `{prefix}:dedup:{key}`, claimed
with `SET NX PX` (the call's fingerprint in it, and the store's epoch checked: one round
trip) and closed with the reply; closing also publishes on `{prefix}:dedup-done:{key}` for
waiters, and keeps the books that hold the records within their bounds. A run whose
worker's heartbeat key is gone, or names another incarnation, was cut short.

Records must outlive a Redis restart (`appendonly yes`) and must not be evicted (a
worker refuses a Redis whose `maxmemory-policy` evicts). A Redis that comes back empty
has forgotten which calls ran: every worker notices at its next claim or heartbeat, says
so loudly, writes back what it wrote that still lives (its `Journal`) and, while a worker
that was at work before has not, refuses calls the store does not know whose tools are
not safe to repeat (`redis_fleet.py`, `recovery.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Self

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from toolbus.dedup.cancels import REMEMBER, remember_call, tombstones_key
from toolbus.dedup.ledger import Bounds
from toolbus.dedup.recovery import GRACE_S, Journal
from toolbus.dedup.redis_connect import connect, on_node_of
from toolbus.dedup.redis_fleet import HEARTBEAT_S, Fleet
from toolbus.dedup.redis_scripts import CLAIM, FINISH, RELEASE, TAKE_OVER, UNCLAIM, WRITE_RUN
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
from toolbus.wire.store_url import key_prefix, where
from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.dedup")

RECONNECT_RETRIES = 2  # a lost connection made again, then the command sent again

FAILED_CLAIMS_KEPT = 1_000  # `KeptReplies` asks at once: a few at most, but bounded

# What a finished record costs Redis beyond its key and its JSON: the record's own key
# and entry, and the books' four entries naming it (`redis_scripts.py`), measured with
# `INFO memory` (docs/reliability.md, "Sizing Redis").
REDIS_RECORD_OVERHEAD_BYTES = 600

# Policies under which Redis, at its `maxmemory`, deletes records it holds: a finished
# call's record gone runs its repeat again, another caller's as soon as one's.
_EVICTING = "allkeys-lru allkeys-lfu allkeys-random volatile-lru volatile-lfu volatile-random "
_EVICTING += "volatile-ttl"


class RedisStore:
    def __init__(
        self,
        url: str,
        worker_id: str,
        *,
        prefix: str,
        timeout_s: float = 5.0,
        ttl_s: float = 600.0,
        bounds: Bounds | None = None,
        on_emptied: Callable[[], None] = lambda: None,
    ) -> None:
        self._redis = connect(
            url,
            timeout_s=timeout_s,
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
        self._where = where(url).shown
        self._prefix = key_prefix(url, prefix)
        self._bounds = bounds or Bounds()
        # EVALSHA, loaded again on NOSCRIPT (a Redis restarted): the scripts are sent once.
        self._claim = self._redis.register_script(CLAIM)
        self._take_over = self._redis.register_script(TAKE_OVER)
        self._finish = self._redis.register_script(FINISH)
        self._release = self._redis.register_script(RELEASE)
        self._unclaim = self._redis.register_script(UNCLAIM)
        self._write_run = self._redis.register_script(WRITE_RUN)
        self._remember = self._redis.register_script(REMEMBER)
        self._heartbeat: asyncio.Task[None] | None = None
        # What this worker wrote that still lives, to write back to an emptied store.
        self._journal = Journal(self._bounds.max_bytes // 2)  # docs/reliability.md, sizing
        self._fleet = Fleet(
            self._redis,
            self._prefix,
            worker_id,
            self._incarnation,
            ttl_s=ttl_s,
            journal=self._journal,
            write_back=self._write_back,
            on_emptied=on_emptied,
        )
        # Claims that raised, by key: what each tried to write (`failed_claim`).
        self._failed: dict[str, Started] = {}
        self._gave_way = {"shrunk": 0, "forgotten": 0}  # by this worker's closes

    def held_bytes(self) -> int:
        return self._fleet.held_bytes

    def gave_way(self) -> dict[str, int]:
        return dict(self._gave_way)

    def _key(self, key: str) -> str:
        return f"{self._prefix}:dedup:{key}"

    def _channel(self, key: str) -> str:
        return f"{self._prefix}:dedup-done:{key}"

    async def __aenter__(self) -> Self:
        at = f"Redis at {self._where}"  # never the URL: it may hold a password
        try:
            await self._fleet.beat()  # fails here, at start-up, when Redis is unreachable
            memory = await self._redis.info("memory", **on_node_of(self._redis, self._key("")))
        except (RedisError, RedisClusterException) as exc:  # the latter: no node answered
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
            await self._redis.delete(self._fleet.alive_key(self._worker_id))
        await self._redis.aclose()

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)  # a period, not a synchronisation
            try:
                await self._fleet.beat()
            except Exception as exc:  # Redis away for a moment: keep beating
                log.warning("dedup heartbeat failed: %s", exc)

    def _started(self, fingerprint: str, delivery: str | None = None) -> Started:
        return Started(self._worker_id, self._incarnation, time.time(), fingerprint, delivery)

    async def claim(
        self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN, delivery: str | None = None
    ) -> Claim:
        started = self._started(fingerprint, delivery)
        mine, tombs = started.to_json(), tombstones_key(self._prefix, key)
        for _ in range(3):  # the store emptied under the claim, or the record expired meanwhile
            await self._fleet.settled(GRACE_S)  # after a loss, once live workers wrote back
            try:
                found = await self._claim(
                    keys=[self._key(key), self._fleet.epoch_key(), tombs],
                    args=[mine, int(ttl_s * 1000), self._fleet.epoch or "", key],
                )
            except Exception:
                # Sent, maybe: a stalled Redis runs it once it resumes (`failed_claim`).
                self._failed[key] = started
                if len(self._failed) > FAILED_CLAIMS_KEPT:  # nobody asks (no `KeptReplies`)
                    del self._failed[next(iter(self._failed))]
                raise
            if isinstance(found, list):  # another epoch: emptied or replaced; nothing written
                await self._fleet.emptied(None)
                continue
            if found is None:  # expired in between: try once more
                continue
            if found in (1, 2) or _text(found) == mine:  # ours (a lost answer to our SET too)
                return await self._fresh(key, mine, ttl_s, cancelled=found == 2)
            return await self._found(_text(found) or "")
        raise RedisError("the dedup store changed under three claims in a row")

    async def _fresh(self, key: str, claimed: str, ttl_s: float, *, cancelled: bool) -> Claim:
        """Ours: new, unless the store was emptied and `key` may be a call that ran then."""
        self._journal.wrote(key, claimed, time.time() + ttl_s)
        doubt_until = self._fleet.doubt_until()
        if doubt_until:
            return Claim("doubtful", doubt_until=doubt_until, cancelled=cancelled)
        return Claim("fresh", cancelled=cancelled)

    async def remember_cancel(self, key: str, ttl_s: float) -> None:
        bounds = self._bounds.cancel_caller_max_bytes, self._bounds.cancel_max_bytes
        keys, args = remember_call(self._prefix, key, ttl_s, *bounds)
        await self._remember(keys=keys, args=args)

    async def _found(self, raw: str) -> Claim:
        record = parse(raw)
        held, delivery = record.fingerprint, record.delivery
        if isinstance(record, Done):
            return Claim(
                "done", reply=record.reply, fingerprint=held, stored=raw, delivery=delivery
            )
        if await self._running(record):
            return Claim("running", started=record, fingerprint=held, delivery=delivery)
        return Claim("orphaned", started=record, fingerprint=held, delivery=delivery)

    async def _running(self, record: Started) -> bool:
        """Does the incarnation that started this run still live?"""
        alive = await self._redis.get(self._fleet.alive_key(record.worker_id))
        return _text(alive) == record.incarnation

    async def take_over(
        self,
        key: str,
        previous: Started,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        delivery: str | None = None,
    ) -> bool:
        return await self._replace(key, previous.to_json(), ttl_s, fingerprint, delivery)

    async def supersede(
        self,
        key: str,
        previous: Claim,
        ttl_s: float,
        *,
        fingerprint: str,
        delivery: str | None = None,
    ) -> bool:
        if previous.reply is None:
            return False  # only a reply is superseded
        # Compared as stored: rebuilt, a record with its summary never matched, and a
        # provider's next `call_0` then ran unclaimed, its repeats running again.
        was = Done(previous.reply, previous.fingerprint, delivery=previous.delivery)
        seen = previous.stored or was.to_json()
        return await self._replace(key, seen, ttl_s, fingerprint, delivery)

    async def _replace(
        self, key: str, seen: str, ttl_s: float, fingerprint: str, delivery: str | None
    ) -> bool:
        mine = self._started(fingerprint, delivery).to_json()
        taken = await self._take_over(
            keys=[self._key(key)], args=[seen, mine, int(ttl_s * 1000), key, self._prefix]
        )
        # Taken, or taken by this very call before its answer was lost (a retry): ours.
        ours = bool(taken) or _text(await self._redis.get(self._key(key))) == mine
        if ours:
            self._journal.wrote(key, mine, time.time() + ttl_s)
        return ours

    async def finish(
        self,
        key: str,
        reply: bytes,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        summary: bytes | None = None,
        delivery: str | None = None,
    ) -> None:
        written = await self._finish(
            keys=[self._key(key)],
            args=self._finish_args(key, Done(reply, fingerprint, summary, delivery), ttl_s),
        )
        if not written:
            self._journal.forget(key)
            log.info("%s is another run's now: its reply is not stored", described(key))
            return
        # What an emptied store gets back: the summary, small replies whole.
        back = Done(summary or reply, fingerprint, delivery=delivery).to_json()
        self._journal.wrote(key, back, time.time() + ttl_s)
        if isinstance(written, list):  # closed, and how many records gave way to it
            self._gave_way["shrunk"] += int(written[1])
            self._gave_way["forgotten"] += int(written[2])

    def _finish_args(
        self, key: str, done: Done, ttl_s: float, *, write_back: bool = False
    ) -> list[str | int]:
        return [
            *self._mine(done.fingerprint),
            done.to_json(),
            max(1, int(ttl_s * 1000)),
            self._channel(key),
            self._prefix,
            key,
            REDIS_RECORD_OVERHEAD_BYTES,
            int(done.summary is not None),
            self._bounds.caller_max_bytes,
            self._bounds.max_bytes,
            int(write_back),
        ]

    async def _write_back(self, entries: list[tuple[str, str, float]]) -> None:
        """The journal into an emptied store: runs as claimed, calls as closed, also over
        a run claimed there since (a claim in doubt, which its worker then withdraws or
        finds another's: the call written back came first); a reply there is left alone."""
        async with self._redis.pipeline(transaction=False) as back:
            for key, record, left_s in entries:
                found, px = parse(record), max(1, int(left_s * 1000))
                if isinstance(found, Started):
                    await self._write_run(keys=[self._key(key)], args=[record, px], client=back)
                else:
                    args = self._finish_args(key, found, left_s, write_back=True)
                    await self._finish(keys=[self._key(key)], args=args, client=back)
            results = await back.execute()
        kept = sum(1 for r in results if r)
        log.info(
            "wrote %d of %d records back to the emptied dedup store (the rest held replies)",
            kept,
            len(entries),
        )

    async def release(self, key: str, *, fingerprint: str = UNKNOWN) -> None:
        self._journal.forget(key)
        await self._release(
            keys=[self._key(key)], args=[*self._mine(fingerprint), self._channel(key)]
        )

    def failed_claim(self, key: str) -> Started | None:
        return self._failed.pop(key, None)

    async def unclaim(self, key: str, claimed: Started) -> None:
        # Answered is done, deleted or not: the failed claim's SET was in its connection
        # when Redis stalled, and Redis reads that before a command sent after it resumed.
        self._journal.forget(key)
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
