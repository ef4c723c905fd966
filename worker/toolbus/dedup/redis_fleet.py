"""The workers sharing one Redis: heartbeats, the store's epoch, and recovery once it was emptied.

Each worker process keeps `{p}:alive:{worker_id}` set to its incarnation (a run whose
worker's key is gone, or names another incarnation, was cut short), and its member name
in `{p}:workers` scored by when it last beat: who has been at work within `dedup_ttl_s`.

`{p}:epoch` is written once (`SET NX`) by the first worker to use the store; every claim
carries the epoch its worker knows (`redis_scripts.CLAIM` refuses on another), and every
heartbeat reads it. A store found without it, or with another, was emptied (restarted
without persistence, flushed) or replaced: the worker logs one ERROR, counts it, adopts
the new epoch and recovers (`recovery.py`): it writes back its journal, and records
under `{p}:recovery:{epoch}` the workers it had seen at work and under
`{p}:written:{epoch}` that it wrote back. Every worker, and any that starts meanwhile,
reads both to know until when an id the store does not know may be an old call.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from toolbus.dedup.recovery import GRACE_S, Journal, Recovery, member

log = logging.getLogger("toolbus.dedup")

HEARTBEAT_S = 2.0
ALIVE_TTL_S = 6.0  # three heartbeats: a slow loop is not mistaken for a dead worker


class Fleet:
    """This worker among those sharing the store.

    Args:
        redis: the store's client.
        prefix: the store's key prefix.
        worker_id, incarnation: this worker process.
        ttl_s: how long records live (`dedup_ttl_s`): how far back a lost record reaches.
        journal: what this worker would write back.
        write_back: writes one journal entry (key, record, seconds left) to the store.
        on_emptied: hears each emptied store noticed.
    """

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        worker_id: str,
        incarnation: str,
        *,
        ttl_s: float,
        journal: Journal,
        write_back: Callable[[list[tuple[str, str, float]]], Awaitable[None]],
        on_emptied: Callable[[], None],
    ) -> None:
        self._redis, self._prefix = redis, prefix
        self.worker_id, self.incarnation = worker_id, incarnation
        self._me = member(worker_id, incarnation)
        self._ttl_s, self._journal, self._write_back = ttl_s, journal, write_back
        self._on_emptied = on_emptied
        self.epoch: str | None = None  # the store's, as adopted; None until opened
        self.held_bytes = 0  # the fleet's books, as the last heartbeat read them
        self._members: dict[str, float] = {}  # seen at work within the TTL: member -> when
        self._recovery: Recovery | None = None
        self._followed_at = 0.0  # monotonic: when the recovery's state was last read
        self._owed: str | None = None  # an epoch whose recovery failed: tried again each beat
        self._joined: str | None = None  # the epoch whose recovery this worker took part in
        self._lock = asyncio.Lock()  # one adoption of a new epoch at a time

    def alive_key(self, worker_id: str) -> str:
        return f"{self._prefix}:alive:{worker_id}"

    def epoch_key(self) -> str:
        return f"{self._prefix}:epoch"

    async def beat(self) -> None:
        """Say this incarnation lives, read who else has been at work, and see that the
        store still has its records: one round trip."""
        now = time.time()
        workers = f"{self._prefix}:workers"
        async with self._redis.pipeline(transaction=False) as beat:
            beat.set(self.alive_key(self.worker_id), self.incarnation, px=int(ALIVE_TTL_S * 1000))
            beat.zadd(workers, {self._me: now})
            beat.zremrangebyscore(workers, "-inf", now - self._ttl_s)
            beat.zrange(workers, 0, -1, withscores=True)
            beat.pexpire(workers, int(self._ttl_s * 1000))
            beat.get(self.epoch_key())
            beat.get(f"{self._prefix}:dedup-bytes")
            beat.exists(self._recovery_key(self.epoch or ""))
            *_, seen, _, epoch, held, recovering = await beat.execute()
        self.held_bytes = int(held or 0)
        if self.epoch is None or _text(epoch) != self.epoch:
            await self.emptied(_text(epoch))  # before `seen`: it is the emptied store's
        elif self._owed is not None:
            async with self._lock:  # it failed last time: what we know still counts
                if self._owed is not None:
                    await self._recover(self._owed)
        elif recovering and self._joined != self.epoch:
            # Recorded under the epoch we made ourselves: we started on the emptied store
            # before an older worker noticed. Nothing of ours was lost; their doubt is ours.
            await self._join(self.epoch)
        self._members = {_text(m) or "": float(score) for m, score in seen}
        if self._recovery is not None:
            await self._follow()

    def _recovery_key(self, epoch: str) -> str:
        return f"{self._prefix}:recovery:{epoch}"

    async def emptied(self, found: str | None) -> None:
        """The store holds `found`, not our epoch: adopt the store's (made now if it has
        none); a worker that knew another says so loudly and recovers."""
        async with self._lock:
            if self.epoch is not None and found == self.epoch:
                return  # adopted meanwhile (a claim and a heartbeat both noticed)
            current, made = await self._adopt()
            if self.epoch is not None and current == self.epoch:
                return
            known, self.epoch = self.epoch, current
            if known is None:
                if made:  # nobody used this store before, or it was emptied with no worker on
                    log.warning(
                        "the dedup store has no epoch: this is its first use, or it lost its "
                        "records while no worker ran (then repeats of earlier calls may run "
                        "again; the store needs appendonly yes)"
                    )
                await self._join(current)  # opening: join a recovery under way, if any
                return
            log.error(
                "dedup store emptied: its records of earlier calls are gone (Redis restarted "
                "without persistence, flushed, or replaced); writing back what this worker "
                "knows, and refusing calls that may have run until it is safe",
                extra={"epoch_was": known, "epoch_found": found, "epoch_now": current},
            )
            self._on_emptied()
            self._owed = current  # until written back: a failure is tried again next beat
            await self._recover(current)

    async def _adopt(self) -> tuple[str, bool]:
        """The store's epoch, made now if it had none (and whether we made it)."""
        async with self._redis.pipeline(transaction=True) as adopt:
            adopt.set(self.epoch_key(), uuid.uuid4().hex, nx=True)
            adopt.get(self.epoch_key())
            made, current = await adopt.execute()
        return _text(current) or "", bool(made)

    async def _recover(self, epoch: str) -> None:
        """Say we live again, write back the journal, then record who we saw and that we
        wrote back (and how whole our journal was)."""
        await self._redis.set(
            self.alive_key(self.worker_id), self.incarnation, px=int(ALIVE_TTL_S * 1000)
        )
        await self._write_back(self._journal.live())
        px = int(self._ttl_s * 1000)
        seen = {**self._members, self._me: time.time()}
        async with self._redis.pipeline(transaction=False) as record:
            for name, last_seen in seen.items():
                record.hsetnx(f"{self._prefix}:recovery:{epoch}", name, last_seen)
            record.pexpire(f"{self._prefix}:recovery:{epoch}", px)
            record.hset(f"{self._prefix}:written:{epoch}", self._me, self._journal.incomplete_until)
            record.pexpire(f"{self._prefix}:written:{epoch}", px)
            await record.execute()
        self._owed, self._joined = None, epoch
        self._recovery = Recovery(epoch, time.time(), {}, {}, frozenset(), self._ttl_s)
        await self._follow()

    async def _join(self, epoch: str) -> None:
        """A recovery under way that this worker had no records in: it says it wrote back
        (nothing, whole: nobody waits for it) and follows the others' doubt."""
        if not await self._redis.exists(self._recovery_key(epoch)):
            return
        await self._redis.hset(f"{self._prefix}:written:{epoch}", self._me, 0.0)
        self._joined = epoch
        self._recovery = Recovery(epoch, time.time(), {}, {}, frozenset(), self._ttl_s)
        await self._follow()

    async def _follow(self) -> None:
        """Read the recovery's state again; forget it once no doubt is left."""
        recovery = self._recovery
        if recovery is None:
            return
        self._followed_at = time.monotonic()
        async with self._redis.pipeline(transaction=False) as read:
            read.hgetall(f"{self._prefix}:recovery:{recovery.epoch}")
            read.hgetall(f"{self._prefix}:written:{recovery.epoch}")
            read.zrange(f"{self._prefix}:workers", 0, -1, withscores=True)
            before, written, beating = await read.execute()
        # Those seen before the loss (doubted), and those beating since (waited for).
        members = _floats(before)
        since = frozenset(_floats(dict(beating)))
        workers = {name.partition("\x1f")[0] for name in members.keys() | since}
        alive = await self._alive(workers)
        self._recovery = Recovery(
            recovery.epoch,
            recovery.began_at,
            members,
            _floats(written),
            frozenset(m for m in members.keys() | since if alive.get(m.partition("\x1f")[0]) == m),
            self._ttl_s,
            since,
        )
        now = time.time()
        if not self._recovery.pending(now) and self._recovery.doubt_until() <= now:
            log.info("dedup store recovered: every id it does not know is new again")
            self._recovery = None

    async def _alive(self, workers: set[str]) -> dict[str, str]:
        """worker id -> the member alive under it now."""
        if not workers:
            return {}
        names = sorted(workers)
        incarnations = await self._redis.mget([self.alive_key(w) for w in names])
        return {w: member(w, i) for w, i in zip(names, map(_text, incarnations), strict=True) if i}

    async def settled(self, bound_s: float) -> None:
        """Before a claim in a recovery: until every live worker has written back (or
        `bound_s`), so no claim takes an id a worker is about to write back. Ours first: a
        write-back that failed is made again here, or the claim fails with it (`unavailable`:
        nothing runs while what this worker knows is not in the store)."""
        if self._owed is not None:
            async with self._lock:
                if self._owed is not None:
                    await self._recover(self._owed)
        if self._recovery is None:
            return
        if not self._recovery.pending(time.time()) and time.monotonic() - self._followed_at < 1:
            return  # settled, read within the second: no round trips for each claim
        end = time.monotonic() + bound_s
        await self._follow()
        while self._recovery is not None and self._recovery.pending(time.time()):
            if time.monotonic() >= end:
                return
            await asyncio.sleep(0.1)  # polling the store's recovery, within `bound_s`
            await self._follow()

    def doubt_until(self) -> float:
        """Until when an id the store does not know may be an old call (Unix time; 0: it
        is new), as last read."""
        if self._recovery is None:
            return 0.0
        until = self._recovery.doubt_until()
        if self._recovery.pending(time.time()):
            until = max(until, time.time() + GRACE_S)  # gone past the bound: not settled
        return until if until > time.time() else 0.0


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _floats(raw: dict[Any, Any]) -> dict[str, float]:
    return {_text(k) or "": float(v) for k, v in raw.items()}
