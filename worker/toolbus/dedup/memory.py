"""The in-process dedup store: one worker, records kept in a dict until their TTL.

It protects against a requester's retries reaching the same worker; a crashed worker
forgets everything, so replicas and crash-safe deduplication need the Redis store.
Memory is bounded twice: by the TTL, and by `max_records`, so a flood of ids costs at
most `max_records` replies (about 1 KiB each). The bound is shared between callers: at
the bound, the finished record that goes is the oldest of the caller holding the most
(the claimer, on a tie), so one caller's flood of ids forgets that caller's own calls;
another caller loses one only once it holds as many as the flooder. Every anonymous
client is one caller here (one bucket, `_owner`): reply topics cost nothing to make, so
a flood from fresh reply topics forgets anonymous calls, never a named caller's.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Self

from toolbus.dedup.store import KEY_SEP, UNKNOWN, Claim, Started, described

log = logging.getLogger("toolbus.dedup")


@dataclass(slots=True)
class _Record:
    expires_at: float
    started: Started | None = None
    reply: bytes | None = None
    closed: asyncio.Event | None = None  # made by the first waiter: most never have one
    fingerprint: str = UNKNOWN  # what the call asked for

    def close(self) -> None:
        if self.closed is not None:
            self.closed.set()


class MemoryStore:
    def __init__(self, worker_id: str, max_records: int = 10_000) -> None:
        self._me = Started(worker_id, uuid.uuid4().hex, 0.0)
        self._records: dict[str, _Record] = {}
        # Finished records per caller, oldest finished first: what eviction chooses from.
        self._finished: dict[str, dict[str, None]] = {}
        # Callers by how many finished records they hold, and the most anyone holds: the
        # caller to evict from is found in O(1), however many callers there are.
        self._by_count: dict[int, dict[str, None]] = {}
        self._most = 0
        self._max_records = max_records
        self._claims = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._records.clear()
        self._finished.clear()
        self._by_count.clear()
        self._most = 0

    def _live(self, key: str) -> _Record | None:
        record = self._records.get(key)
        if record is not None and record.expires_at <= time.monotonic():
            self._forget(key)
            return None
        return record

    def _forget(self, key: str) -> _Record | None:
        record = self._records.pop(key, None)
        if record is not None and record.reply is not None:
            owner = _owner(key)
            finished = self._finished[owner]
            del finished[key]
            self._recount(owner, len(finished) + 1, len(finished))
            if not finished:
                del self._finished[owner]
        return record

    def _recount(self, owner: str, was: int, now: int) -> None:
        """`owner` went from `was` finished records to `now` (one more or one fewer)."""
        if was:
            peers = self._by_count[was]
            del peers[owner]
            if not peers:
                del self._by_count[was]
                if was == self._most and now < was:
                    self._most = now  # the owner that held the most still holds `now`
        if now:
            self._by_count.setdefault(now, {})[owner] = None
            self._most = max(self._most, now)

    def _sweep(self) -> None:
        # Amortized: expired records go when the dict has grown past what is live.
        now = time.monotonic()
        for key in [k for k, r in self._records.items() if r.expires_at <= now]:
            self._forget(key)

    def _evict(self, count: int, claimer: str) -> None:
        """`count` finished records, each the oldest of the caller holding the most (the
        claimer itself on a tie): a flood of one caller's ids forgets its own. Running ones
        (at most the worker's concurrency) stay, or their repeats would run the call a
        second time. O(1) each."""
        for _ in range(count):
            if not self._most:
                return
            most = self._by_count[self._most]
            owner = claimer if claimer in most else next(iter(most))
            self._forget(next(iter(self._finished[owner])))

    async def claim(self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN) -> Claim:
        record = self._live(key)
        if record is None:
            self._claims += 1
            if self._claims % 1024 == 0:  # amortized; runs also at the bound
                self._sweep()
            if len(self._records) >= self._max_records:
                self._evict(len(self._records) - self._max_records + 1, _owner(key))
            started = Started(self._me.worker_id, self._me.incarnation, time.time(), fingerprint)
            self._records[key] = _Record(
                time.monotonic() + ttl_s, started=started, fingerprint=fingerprint
            )
            return Claim("fresh")
        if record.reply is not None:
            return Claim("done", reply=record.reply, fingerprint=record.fingerprint)
        # This process: alive by definition.
        return Claim("running", started=record.started, fingerprint=record.fingerprint)

    async def take_over(
        self, key: str, previous: Started, ttl_s: float, *, fingerprint: str = UNKNOWN
    ) -> bool:
        return False  # nothing here outlives its process, so nothing is ever orphaned

    async def supersede(self, key: str, previous: Claim, ttl_s: float, *, fingerprint: str) -> bool:
        record = self._live(key)
        seen = (previous.reply, previous.fingerprint)
        if record is None or record.reply is None or (record.reply, record.fingerprint) != seen:
            return False  # changed meanwhile
        self._forget(key)
        return (await self.claim(key, ttl_s, fingerprint=fingerprint)).kind == "fresh"

    async def finish(
        self, key: str, reply: bytes, ttl_s: float, *, fingerprint: str = UNKNOWN
    ) -> None:
        record = self._live(key)
        if record is not None and record.reply == reply:
            return  # written already (a kept reply written again)
        if record is not None and not _ours(record, fingerprint):
            # Another run's now: this claim outlived its TTL and the key was claimed
            # afresh (a provider's `call_0` of the next turn). Its repeats must get its
            # own reply, not this one: compare and set, as the Redis store does.
            log.info("%s is another run's now: its reply is not stored", described(key))
            return
        record = self._forget(key) or _Record(0.0, fingerprint=fingerprint)
        record.expires_at, record.reply = time.monotonic() + ttl_s, reply
        self._records[key] = record
        # Last of its caller's: evicted by when it finished, whenever it was claimed.
        owner = _owner(key)
        finished = self._finished.setdefault(owner, {})
        finished[key] = None
        self._recount(owner, len(finished) - 1, len(finished))
        record.close()

    async def release(self, key: str, *, fingerprint: str = UNKNOWN) -> None:
        # Only this run's own claim: a late release must not free another run's.
        record = self._live(key)
        if record is not None and _ours(record, fingerprint):
            self._forget(key)
            record.close()  # waiters look again and run the call themselves

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


def _owner(key: str) -> str:
    """Whose a key is, for the bound: its caller (what `Once.key` puts before the id), and
    "" for every anonymous client together (their keys start with `KEY_SEP`; the reply
    topic that tells them apart is free to make, so it buys no share of the bound)."""
    owner, sep, _ = key.partition(KEY_SEP)
    return owner if sep else ""
