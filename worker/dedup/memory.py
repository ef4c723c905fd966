"""The in-process dedup store: one worker, records kept in a dict until their TTL.

It protects against a requester's retries reaching the same worker; a crashed worker
forgets everything, so replicas and crash-safe deduplication need the Redis store.
Memory is bounded twice: by the TTL, and by `max_records`, so a flood of ids costs at
most `max_records` replies (about 1 KiB each). The bound is shared fairly between
callers: at the bound, a finished record goes from a caller holding at least its even
share, its oldest first, so one caller's flood of ids forgets that caller's own calls,
never another's (the caller is the part of the key before `KEY_SEP`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Self

from toolbus.dedup.store import KEY_SEP, UNKNOWN, Claim, Started


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
        self._finished_count = 0
        self._max_records = max_records
        self._claims = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._records.clear()
        self._finished.clear()
        self._finished_count = 0

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
            self._finished_count -= 1
            if not finished:
                del self._finished[owner]
        return record

    def _sweep(self) -> None:
        # Amortized: expired records go when the dict has grown past what is live.
        now = time.monotonic()
        for key in [k for k, r in self._records.items() if r.expires_at <= now]:
            self._forget(key)

    def _evict(self, count: int, claimer: str) -> None:
        """`count` finished records, each the oldest of a caller holding at least an even
        share of them (the claimer itself first, when it does): a flood of one caller's ids
        forgets its own. Running ones (at most the worker's concurrency) stay, or their
        repeats would run the call a second time."""
        for _ in range(count):
            if not self._finished:
                return
            share = self._finished_count / len(self._finished)
            owner = claimer if len(self._finished.get(claimer, ())) >= share else None
            if owner is None:  # someone holds at least the average: the first such goes
                owner = next(o for o, keys in self._finished.items() if len(keys) >= share)
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
        record = self._forget(key) or _Record(0.0, fingerprint=fingerprint)
        record.expires_at, record.reply = time.monotonic() + ttl_s, reply
        self._records[key] = record
        # Last of its caller's: evicted by when it finished, whenever it was claimed.
        self._finished.setdefault(_owner(key), {})[key] = None
        self._finished_count += 1
        record.close()

    async def release(self, key: str) -> None:
        record = self._forget(key)
        if record is not None:
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


def _owner(key: str) -> str:
    """Whose a key is: what `Once.key` puts before the id (the caller, or for an anonymous
    client its reply topic, so anonymous clients are shared fairly too); "" without one."""
    owner, sep, _ = key.rpartition(KEY_SEP)
    return owner if sep else ""
