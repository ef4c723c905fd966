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

At most `max_kept` replies are kept (a long outage fails new claims first, so few
calls get as far as a failed write); beyond that a reply is not kept, and says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Self

from tenacity import AsyncRetrying, stop_after_delay, wait_random_exponential

from toolbus.dedup.store import UNKNOWN, Claim, DedupStore, Started
from toolbus.tasks import cancel_and_wait

log = logging.getLogger("toolbus.dedup")

RETRY_MAX_DELAY_S = 1.0  # between two writes, at most: one writer, so cheap while away
FLUSH_S = 2.0  # a stopping worker's last chance to write what it keeps


class KeptReplies:
    """A `DedupStore` over `store` whose replies survive a failed write.

    Args:
        store: where the records live.
        max_kept: how many unwritten replies this worker keeps at most.
        write_timeout_s: how long one write may take (the reply waits for the first);
            the store's client may retry within it.
        first_retry_s: the backoff's first step (it doubles, jittered, to 1 s).
    """

    def __init__(
        self,
        store: DedupStore,
        *,
        max_kept: int = 10_000,
        write_timeout_s: float = 5.0,
        first_retry_s: float = 0.1,
    ) -> None:
        self.store = store
        self._max_kept, self._first_retry_s = max_kept, first_retry_s
        self._write_timeout_s = write_timeout_s
        # Oldest first: (reply, TTL, when the record stops mattering (monotonic), what
        # its call asked for).
        self._kept: dict[str, tuple[bytes, float, float, str]] = {}
        self._writer: asyncio.Task[None] | None = None  # one, however many are kept
        self._written = asyncio.Event()  # set when the writer has emptied `_kept`

    def kept(self) -> int:
        """How many replies wait to be written."""
        return len(self._kept)

    async def all_written(self) -> None:
        """Until every kept reply is written (or given up)."""
        while self._kept:
            self._written.clear()
            await self._written.wait()

    async def __aenter__(self) -> Self:
        await self.store.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            await asyncio.wait({self._writer}, timeout=FLUSH_S)
            if self._kept:
                log.warning(
                    "stopping with %d replies not written to the dedup store: their "
                    "repeats will get in_doubt",
                    len(self._kept),
                )
            await cancel_and_wait(self._writer)
        await self.store.__aexit__(*exc)

    async def claim(self, key: str, ttl_s: float, *, fingerprint: str = UNKNOWN) -> Claim:
        kept = self._kept.get(key)
        if kept is not None:  # answered here; the store does not know it yet
            return Claim("done", reply=kept[0], fingerprint=kept[3])
        return await self.store.claim(key, ttl_s, fingerprint=fingerprint)

    async def take_over(
        self, key: str, previous: Started, ttl_s: float, *, fingerprint: str = UNKNOWN
    ) -> bool:
        return await self.store.take_over(key, previous, ttl_s, fingerprint=fingerprint)

    async def supersede(self, key: str, previous: Claim, ttl_s: float, *, fingerprint: str) -> bool:
        if key in self._kept:  # the store still holds the run as started: not replaceable
            return False
        return await self.store.supersede(key, previous, ttl_s, fingerprint=fingerprint)

    async def finish(
        self, key: str, reply: bytes, ttl_s: float, *, fingerprint: str = UNKNOWN
    ) -> None:
        try:
            await self._finish(key, reply, ttl_s, fingerprint)
        except Exception as exc:
            self._keep(key, reply, ttl_s, fingerprint, exc)

    async def _finish(self, key: str, reply: bytes, ttl_s: float, fingerprint: str) -> None:
        """One write, bounded: a stalled store must not hold the reply back."""
        async with asyncio.timeout(self._write_timeout_s):
            await self.store.finish(key, reply, ttl_s, fingerprint=fingerprint)

    async def release(self, key: str) -> None:
        await self.store.release(key)

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = UNKNOWN) -> bytes | None:
        if key in self._kept:
            return self._kept_reply(key, fingerprint)
        try:
            reply = await self.store.wait(key, timeout_s, fingerprint=fingerprint)
        except Exception:
            if key not in self._kept:  # the store is away, and the run was not here
                raise
            return self._kept_reply(key, fingerprint)
        return (
            reply
            if reply is not None or key not in self._kept
            else self._kept_reply(key, fingerprint)
        )

    def _kept_reply(self, key: str, fingerprint: str) -> bytes | None:
        """The kept reply of `key`, if its call asked for what `fingerprint` asks."""
        reply, _, _, held = self._kept[key]
        return reply if held in (fingerprint, UNKNOWN) else None

    def _keep(self, key: str, reply: bytes, ttl_s: float, fingerprint: str, exc: Exception) -> None:
        if len(self._kept) >= self._max_kept:
            log.error(
                "dedup store failed closing %s and %d replies already wait to be written: "
                "not kept; its repeats may get timeout or in_doubt: %s",
                key,
                len(self._kept),
                exc,
            )
            return
        log.warning("dedup store failed closing %s, kept to write again: %s", key, exc)
        self._kept[key] = (reply, ttl_s, time.monotonic() + ttl_s, fingerprint)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="dedup-kept-writer")

    async def _write_all(self) -> None:
        """Oldest first, each until written: one write in flight while the store is away,
        and the rest right after the first goes through."""
        try:
            while self._kept:
                key, (reply, ttl_s, matters_until, fingerprint) = next(iter(self._kept.items()))
                try:
                    await self._write(key, reply, ttl_s, matters_until, fingerprint)
                except Exception as exc:
                    log.error(  # noqa: TRY400 -- a store away, not a bug: no traceback
                        "gave up writing the reply of %s to the dedup store: %s", key, exc
                    )
                del self._kept[key]
        finally:
            self._written.set()

    async def _write(
        self, key: str, reply: bytes, ttl_s: float, matters_until: float, fingerprint: str
    ) -> None:
        retrying = AsyncRetrying(
            wait=wait_random_exponential(multiplier=self._first_retry_s, max=RETRY_MAX_DELAY_S),
            # Past its TTL the record would have expired anyway: nothing is left to correct.
            stop=stop_after_delay(max(0.0, matters_until - time.monotonic())),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._finish(key, reply, ttl_s, fingerprint)
        log.info("kept reply of %s written to the dedup store", key)
