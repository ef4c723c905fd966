"""The in-process dedup store: one worker, records kept in a dict until their TTL.

It protects against a requester's retries reaching the same worker; a crashed worker
forgets everything, so replicas and crash-safe deduplication need the Redis store.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Self

from toolbus.dedup.store import Claim, Started


@dataclass
class _Record:
    expires_at: float
    started: Started | None = None
    reply: bytes | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryStore:
    def __init__(self, worker_id: str) -> None:
        self._me = Started(worker_id, uuid.uuid4().hex, 0.0)
        self._records: dict[str, _Record] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._records.clear()

    def _live(self, key: str) -> _Record | None:
        record = self._records.get(key)
        if record is not None and record.expires_at <= time.monotonic():
            del self._records[key]
            return None
        return record

    def _sweep(self) -> None:
        # Amortized: expired records go when the dict has grown past what is live.
        now = time.monotonic()
        for key in [k for k, r in self._records.items() if r.expires_at <= now]:
            del self._records[key]

    async def claim(self, key: str, ttl_s: float) -> Claim:
        record = self._live(key)
        if record is None:
            if len(self._records) % 1024 == 1023:
                self._sweep()
            started = Started(self._me.worker_id, self._me.incarnation, time.time())
            self._records[key] = _Record(time.monotonic() + ttl_s, started=started)
            return Claim("fresh")
        if record.reply is not None:
            return Claim("done", reply=record.reply)
        return Claim("running", started=record.started)  # this process: alive by definition

    async def take_over(self, key: str, previous: Started, ttl_s: float) -> bool:
        return False  # nothing here outlives its process, so nothing is ever orphaned

    async def finish(self, key: str, reply: bytes, ttl_s: float) -> None:
        record = self._live(key) or _Record(0.0)
        record.expires_at, record.reply = time.monotonic() + ttl_s, reply
        self._records[key] = record
        record.closed.set()

    async def release(self, key: str) -> None:
        record = self._records.pop(key, None)
        if record is not None:
            record.closed.set()  # waiters look again and run the call themselves

    async def wait(self, key: str, timeout_s: float) -> bytes | None:
        record = self._live(key)
        if record is None:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                await record.closed.wait()
        except TimeoutError:
            return None
        return record.reply
