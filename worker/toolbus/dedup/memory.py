"""The in-process dedup store: one worker, records kept in a dict until their TTL.

It protects against a requester's retries reaching the same worker; a crashed worker
forgets everything, so replicas and crash-safe deduplication need the Redis store.
Memory is bounded by the TTL and by the ledger's bounds (`ledger.py`): at most
`max_records` finished records, and at most `caller_max_bytes` of one caller's and
`max_bytes` of all. Past a bytes bound the oldest whole reply of the caller holding the
most gives way to its summary (its repeats get `reply_not_kept`, never a second run); past
the count bound that caller's oldest record is forgotten. So one caller's flood costs its
own records; another caller loses one only once it holds as much as the flooder. Every
anonymous client is one caller here (one owner, `_owner`): reply topics cost nothing to
make, so a flood from fresh reply topics costs anonymous calls, never a named caller's.
Running records (at most the worker's concurrency) are never touched.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Self

from toolbus.dedup.cancels import Tombstones
from toolbus.dedup.ledger import Bounds, Ledger
from toolbus.dedup.store import UNKNOWN, Claim, Started, described, owner_of, record_size

log = logging.getLogger("toolbus.dedup")


@dataclass(slots=True)
class _Record:
    expires_at: float
    started: Started | None = None
    reply: bytes | None = None
    closed: asyncio.Event | None = None  # made by the first waiter: most never have one
    fingerprint: str = UNKNOWN  # what the call asked for
    summary: bytes | None = None  # what may stand in for `reply` at the bytes bounds
    delivery: str | None = None  # the MQTT delivery that made it (`Started.delivery`)

    def close(self) -> None:
        if self.closed is not None:
            self.closed.set()


def closes_at_once(store: object) -> bool:
    """True when closing a run in `store` never suspends (`finish` and `release` of
    `MemoryStore` itself, not of a subclass that may wait): nothing can cancel such a
    close halfway, so a caller need not shield it in a task (calls/answer.py)."""
    kind = type(store)
    return (
        issubclass(kind, MemoryStore)
        and kind.finish is MemoryStore.finish
        and kind.release is MemoryStore.release
    )


class MemoryStore:
    def __init__(
        self, worker_id: str, max_records: int = 10_000, *, bounds: Bounds | None = None
    ) -> None:
        """`bounds`: the ledger's (`max_records` alone leaves the bytes bounds' defaults)."""
        self._me = Started(worker_id, uuid.uuid4().hex, 0.0)
        self._records: dict[str, _Record] = {}
        self.ledger = Ledger(bounds or Bounds(max_records=max_records))
        kept = self.ledger.bounds
        self.tombstones = Tombstones(kept.cancel_caller_max_bytes, kept.cancel_max_bytes)
        self._claims = 0
        self._gave_way = {"shrunk": 0, "forgotten": 0}

    def held_bytes(self) -> int:
        return self.ledger.bytes

    def gave_way(self) -> dict[str, int]:
        return dict(self._gave_way)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._records.clear()
        self.ledger = Ledger(self.ledger.bounds)

    def _live(self, key: str) -> _Record | None:
        record = self._records.get(key)
        if record is not None and record.expires_at <= time.monotonic():
            self._forget(key)
            return None
        return record

    def _forget(self, key: str) -> _Record | None:
        record = self._records.pop(key, None)
        if record is not None and record.reply is not None:
            self.ledger.remove(owner_of(key), key)
        return record

    def _sweep(self) -> None:
        # Amortized: expired records go when the dict has grown past what is live.
        now = time.monotonic()
        for key in [k for k, r in self._records.items() if r.expires_at <= now]:
            self._forget(key)

    def _give_way(self, owner: str) -> bool:
        """`owner`'s oldest whole reply shrunk to its summary, else its oldest record
        forgotten; False when it holds no finished record."""
        key = self.ledger.oldest(owner, whole=True)
        if key is not None:
            record = self._records[key]
            assert record.reply is not None
            assert record.summary is not None
            record.reply, record.summary = record.summary, None
            size = record_size(key, record.reply, None, record.fingerprint, record.delivery)
            self.ledger.shrunk(owner, key, size)
            self._gave_way["shrunk"] += 1
            return True
        key = self.ledger.oldest(owner, whole=False)
        if key is None:
            return False
        self._forget(key)
        self._gave_way["forgotten"] += 1
        return True

    def _bound(self, owner: str) -> None:
        """Within the bytes bounds again after `owner`'s record finished. O(1) a step."""
        while self.ledger.over_caller(owner) and self._give_way(owner):
            pass
        while self.ledger.over_bytes():
            victim = self.ledger.victim_by_bytes(owner)
            if victim is None or not self._give_way(victim):
                return

    def _evict(self, count: int, claimer: str) -> None:
        """`count` finished records, each the oldest of the caller holding the most (the
        claimer itself on a tie): a flood of one caller's ids forgets its own. Running ones
        (at most the worker's concurrency) stay, or their repeats would run the call a
        second time. O(1) each."""
        for _ in range(count):
            owner = self.ledger.victim_by_count(claimer)
            key = None if owner is None else self.ledger.oldest(owner, whole=False)
            if key is None:
                return
            self._forget(key)
            self._gave_way["forgotten"] += 1

    async def claim(
        self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN, delivery: str | None = None
    ) -> Claim:
        record = self._live(key)
        if record is None:
            self._claims += 1
            if self._claims % 1024 == 0:  # amortized; runs also at the bound
                self._sweep()
            if len(self._records) >= self.ledger.bounds.max_records:
                self._evict(len(self._records) - self.ledger.bounds.max_records + 1, owner_of(key))
            me = self._me
            started = Started(me.worker_id, me.incarnation, time.time(), fingerprint, delivery)
            self._records[key] = _Record(
                time.monotonic() + ttl_s,
                started=started,
                fingerprint=fingerprint,
                delivery=delivery,
            )
            return Claim("fresh", cancelled=self.tombstones.cancelled(key))
        held = record.fingerprint, record.delivery
        if record.reply is not None:
            return Claim("done", reply=record.reply, fingerprint=held[0], delivery=held[1])
        # This process: alive by definition.
        return Claim("running", started=record.started, fingerprint=held[0], delivery=held[1])

    async def take_over(
        self,
        key: str,
        previous: Started,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        delivery: str | None = None,
    ) -> bool:
        return False  # nothing here outlives its process, so nothing is ever orphaned

    async def supersede(
        self,
        key: str,
        previous: Claim,
        ttl_s: float,
        *,
        fingerprint: str,
        delivery: str | None = None,
    ) -> bool:
        record = self._live(key)
        seen = (previous.reply, previous.fingerprint, previous.delivery)
        held = None if record is None else (record.reply, record.fingerprint, record.delivery)
        if held is None or held[0] is None or held != seen:
            return False  # changed meanwhile
        self._forget(key)
        claimed = await self.claim(key, ttl_s, fingerprint=fingerprint, delivery=delivery)
        return claimed.kind == "fresh"

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
        record = self._live(key)
        if record is not None and record.reply is not None and record.reply in (reply, summary):
            return  # written already (a kept reply written again)
        if record is not None and not _ours(record, fingerprint):
            # Another run's now: this claim outlived its TTL and the key was claimed
            # afresh (a provider's `call_0` of the next turn). Its repeats must get its
            # own reply, not this one: compare and set, as the Redis store does.
            log.info("%s is another run's now: its reply is not stored", described(key))
            return
        record = self._forget(key) or _Record(0.0, fingerprint=fingerprint)
        record.expires_at, record.reply, record.summary = time.monotonic() + ttl_s, reply, summary
        record.delivery = delivery
        self._records[key] = record
        # Last of its caller's: it gives way by when it finished, whenever it was claimed.
        owner = owner_of(key)
        size = record_size(key, reply, summary, fingerprint, delivery)
        self.ledger.add(owner, key, size, whole=summary is not None)
        self._bound(owner)
        record.close()

    async def release(self, key: str, *, fingerprint: str = UNKNOWN) -> None:
        # Only this run's own claim: a late release must not free another run's.
        record = self._live(key)
        if record is not None and _ours(record, fingerprint):
            self._forget(key)
            record.close()  # waiters look again and run the call themselves

    async def remember_cancel(self, key: str, ttl_s: float) -> None:
        if not self.tombstones.remember(key, ttl_s):
            log.warning("early cancels at their bound: %s not remembered", described(key))

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = UNKNOWN) -> bytes | None:
        record = self._live(key)
        if record is None or record.fingerprint not in (fingerprint, UNKNOWN):
            return None  # gone, or another request's: the caller decides
        if record.reply is not None:
            return record.reply
        if record.closed is None:
            record.closed = asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                await record.closed.wait()
        except TimeoutError:
            return None
        return record.reply


def _ours(record: _Record, fingerprint: str) -> bool:
    """Is `record` a run of `fingerprint`'s request still going? This process is the only
    worker here, so that is this worker's own run (the Redis store's `_OURS`)."""
    return record.reply is None and record.fingerprint == fingerprint
