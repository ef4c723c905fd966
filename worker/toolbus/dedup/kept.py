"""Replies the store could not take: kept by this worker and written again until they are.

A call that ran is closed with its reply before the reply leaves. When that write fails
(Redis stalled, restarting, out of reach) the reply must be neither lost nor held back:
the caller gets it at once, and `KeptReplies` keeps it here and writes it again in the
background (jittered backoff up to 1 s, for as long as the record could matter: its
TTL), so a finished call is not later reported running, timed out or in doubt because
one write failed. Meanwhile:

- a repeat that reaches this worker gets the kept reply, marked `replayed`, even while
  the store is away;
- a repeat that reaches another worker finds the run `started` by this live worker and
  waits for its reply within its own deadline (the write wakes it), or gets `timeout`
  (`still_running`) if the store is away for longer. A store that was stalled past
  the worker's heartbeat TTL comes back with the worker's heartbeat key expired: until
  its next beat (2 s) or the kept write (1 s), a repeat there may find the run cut
  short (`in_doubt`);
- should this worker die before the write succeeds, the run is an orphan in the store,
  and its repeats get `in_doubt` (or run again, for a tool safe to repeat): what the
  store can honestly say.

A release that fails (the call never reached its tool, and the store is away) is kept
the same way and retried: left undone, the record would stay `started` by this live
worker, its repeats would time out for the whole TTL, and after a restart they would
be `in_doubt` for a call that never ran. A claim that fails (answered `unavailable`,
nothing runs) is withdrawn the same way: a stalled store runs it when it resumes, so
exactly what it wrote is deleted (`NetworkStore.unclaim`) once the store answers. A
repeat reaching this worker meanwhile retries the release or withdrawal at once
(bounded), then claims as usual. Late writes are compare-and-set:
a release deletes, and a reply replaces, only this worker's own run of the request (or,
for a reply, a record gone meanwhile), never a record another worker wrote since.

Each kept entry lives as long as its record would (its TTL), then is dropped, written or
not. What is kept is bounded like the store (`Bounds`): at most `max_records` entries and
`max_bytes` of replies (a long outage fails new claims first, so few calls get as far as
a failed write). A reply that would pass the bytes bound is kept as its summary (its
repeats get `reply_not_kept`, never a second run); beyond either bound an entry is not
kept, and says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from tenacity import AsyncRetrying, stop_after_delay, wait_random_exponential

from toolbus.dedup.ledger import Bounds
from toolbus.dedup.store import UNKNOWN, Claim, NetworkStore, Started, described
from toolbus.wire.tasks import cancel_and_wait

log = logging.getLogger("toolbus.dedup")

RETRY_MAX_DELAY_S = 1.0  # between two writes, at most: one writer, so cheap while away
FLUSH_S = 2.0  # a stopping worker's last chance to write what it keeps


@dataclass(frozen=True, slots=True)
class _Kept:
    """A close the store did not take: a reply (`reply`), a release (`reply` None), or
    the withdrawal of a claim that failed but may land late (`claimed`: all it wrote)."""

    reply: bytes | None
    ttl_s: float
    matters_until: float  # monotonic: past it the record would have expired anyway
    fingerprint: str
    claimed: Started | None = None
    summary: bytes | None = None  # what may stand in for `reply`
    delivery: str | None = None  # the MQTT delivery of the run it closes

    def size(self) -> int:
        return len(self.reply or b"") + len(self.summary or b"")

    def live(self) -> bool:
        return time.monotonic() < self.matters_until


class KeptReplies:
    """A `DedupStore` over `store` whose replies and releases survive a failed write.

    Args:
        store: where the records live.
        bounds: how many unwritten replies and releases this worker keeps at most
            (`max_records`), and how many bytes of replies (`max_bytes`).
        write_timeout_s: how long one write may take (the reply waits for the first);
            the store's client may retry within it.
        first_retry_s: the backoff's first step (it doubles, jittered, to 1 s).
    """

    def __init__(
        self,
        store: NetworkStore,
        *,
        bounds: Bounds | None = None,
        write_timeout_s: float = 5.0,
        first_retry_s: float = 0.1,
    ) -> None:
        self.store = store
        self._bounds, self._first_retry_s = bounds or Bounds(), first_retry_s
        self._write_timeout_s = write_timeout_s
        self._kept: dict[str, _Kept] = {}  # oldest first
        self._kept_bytes = 0
        self._writer: asyncio.Task[None] | None = None  # one, however many are kept
        self._claim_ttl_s = 0.0  # the claims' TTL, as last seen: how long a claim lives

    def kept(self) -> int:
        """How many replies and releases wait to be written."""
        return len(self._kept)

    def kept_bytes(self) -> int:
        """How many bytes of replies wait to be written."""
        return self._kept_bytes

    def held_bytes(self) -> int:
        """The store's, and what this worker keeps to write."""
        return self.store.held_bytes() + self._kept_bytes

    def gave_way(self) -> Mapping[str, int]:
        return self.store.gave_way()

    async def all_written(self) -> None:
        """Until every kept entry is written or given up, or the writer has stopped."""
        while self._kept and self._writer is not None and not self._writer.done():
            await asyncio.wait({self._writer})

    async def __aenter__(self) -> Self:
        await self.store.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            await asyncio.wait({self._writer}, timeout=FLUSH_S)
            if self._kept:
                log.warning(
                    "stopping with %d replies or releases not written to the dedup store: "
                    "their repeats will get in_doubt",
                    len(self._kept),
                )
            await cancel_and_wait(self._writer)
        await self.store.__aexit__(*exc)

    def _live(self, key: str) -> _Kept | None:
        kept = self._kept.get(key)
        if kept is not None and not kept.live():
            self._drop(key, kept)  # its record would have expired: nothing left to say
            return None
        return kept

    async def claim(
        self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN, delivery: str | None = None
    ) -> Claim:
        self._claim_ttl_s = ttl_s
        kept = self._live(key)
        if kept is not None and kept.reply is not None:  # answered here; unknown there yet
            return Claim(
                "done", reply=kept.reply, fingerprint=kept.fingerprint, delivery=kept.delivery
            )
        if kept is not None:  # released here, not yet there: release it now, or fail
            await self._write(key, kept)
            self._drop(key, kept)
        try:
            return await self.store.claim(key, ttl_s, fingerprint=fingerprint, delivery=delivery)
        except Exception as exc:
            # Answered `unavailable`, nothing runs; but the claim may land once the store
            # resumes: a live worker's run of a call that never ran (`timeout`, then
            # `in_doubt`). Withdrawn like a failed release: exactly what it wrote.
            claimed = self.store.failed_claim(key)
            if claimed is not None:
                withdraw = _Kept(None, ttl_s, time.monotonic() + ttl_s, fingerprint, claimed)
                self._keep(key, withdraw, exc)
            raise

    async def take_over(
        self,
        key: str,
        previous: Started,
        ttl_s: float,
        *,
        fingerprint: str = UNKNOWN,
        delivery: str | None = None,
    ) -> bool:
        self._claim_ttl_s = ttl_s
        return await self.store.take_over(
            key, previous, ttl_s, fingerprint=fingerprint, delivery=delivery
        )

    async def supersede(
        self,
        key: str,
        previous: Claim,
        ttl_s: float,
        *,
        fingerprint: str,
        delivery: str | None = None,
    ) -> bool:
        self._claim_ttl_s = ttl_s
        if self._live(key) is not None:  # the store still holds the run as started
            return False
        return await self.store.supersede(
            key, previous, ttl_s, fingerprint=fingerprint, delivery=delivery
        )

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
        until = time.monotonic() + ttl_s
        kept = _Kept(reply, ttl_s, until, fingerprint, summary=summary, delivery=delivery)
        try:
            await self._write(key, kept)
        except Exception as exc:
            self._keep(key, kept, exc)

    async def release(self, key: str, *, fingerprint: str = UNKNOWN) -> None:
        ttl_s = self._claim_ttl_s
        kept = _Kept(None, ttl_s, time.monotonic() + ttl_s, fingerprint)
        try:
            await self._write(key, kept)
        except Exception as exc:
            self._keep(key, kept, exc)

    async def _write(self, key: str, kept: _Kept) -> None:
        """One write, bounded: a stalled store must not hold the reply back."""
        async with asyncio.timeout(self._write_timeout_s):
            if kept.claimed is not None:
                await self.store.unclaim(key, kept.claimed)
            elif kept.reply is None:
                await self.store.release(key, fingerprint=kept.fingerprint)
            else:
                await self.store.finish(
                    key,
                    kept.reply,
                    kept.ttl_s,
                    fingerprint=kept.fingerprint,
                    summary=kept.summary,
                    delivery=kept.delivery,
                )

    def _drop(self, key: str, kept: _Kept) -> None:
        if self._kept.get(key) is kept:  # not a newer entry of the same key
            del self._kept[key]
            self._kept_bytes -= kept.size()

    async def remember_cancel(self, key: str, ttl_s: float) -> None:
        await self.store.remember_cancel(key, ttl_s)

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = UNKNOWN) -> bytes | None:
        if self._live(key) is not None:
            return self._kept_reply(key, fingerprint)
        try:
            reply = await self.store.wait(key, timeout_s, fingerprint=fingerprint)
        except Exception:
            if self._live(key) is None:  # the store is away, and the run was not here
                raise
            return self._kept_reply(key, fingerprint)
        if reply is not None or self._live(key) is None:
            return reply
        return self._kept_reply(key, fingerprint)

    def _kept_reply(self, key: str, fingerprint: str) -> bytes | None:
        """The kept reply of `key`, if its call asked for what `fingerprint` asks (None
        for a kept release: the call never ran)."""
        kept = self._kept[key]
        return kept.reply if kept.fingerprint in (fingerprint, UNKNOWN) else None

    def _keep(self, key: str, kept: _Kept, exc: Exception) -> None:
        what = "closing" if kept.reply is not None else "releasing"
        if kept.claimed is not None:
            what = "claiming (it may land late: withdrawn)"
        room = self._bounds.max_bytes - self._kept_bytes
        if kept.size() > room and kept.summary is not None:  # its summary, never a rerun
            kept = _Kept(
                kept.summary,
                kept.ttl_s,
                kept.matters_until,
                kept.fingerprint,
                delivery=kept.delivery,
            )
        if len(self._kept) >= self._bounds.max_records or kept.size() > room:
            log.error(
                "dedup store failed %s %s and %d entries (%d bytes) already wait to be "
                "written: not kept; its repeats may get timeout or in_doubt: %s",
                what,
                described(key),
                len(self._kept),
                self._kept_bytes,
                exc,
            )
            return
        log.warning("dedup store failed %s %s, kept to write again: %s", what, described(key), exc)
        previous = self._kept.pop(key, None)
        if previous is not None:
            self._kept_bytes -= previous.size()
        self._kept[key] = kept
        self._kept_bytes += kept.size()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="dedup-kept-writer")

    async def _write_all(self) -> None:
        """Oldest first, each until written or past its TTL: one write in flight while
        the store is away, and the rest right after the first goes through."""
        while self._kept:
            key, kept = next(iter(self._kept.items()))
            try:
                await self._retry(key, kept)
            except Exception as exc:
                log.error(  # noqa: TRY400 -- a store away, not a bug: no traceback
                    "gave up writing %s to the dedup store: %s", described(key), exc
                )
            self._drop(key, kept)

    async def _retry(self, key: str, kept: _Kept) -> None:
        if not kept.live():
            return  # its record would have expired: nothing is left to correct
        retrying = AsyncRetrying(
            wait=wait_random_exponential(multiplier=self._first_retry_s, max=RETRY_MAX_DELAY_S),
            stop=stop_after_delay(max(0.0, kept.matters_until - time.monotonic())),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._write(key, kept)
        log.info("kept close of %s written to the dedup store", described(key))
