"""The dedup stores kept within bytes, per caller and in all (issue 29.1), memory and Redis.

Each record used to keep its whole reply for `dedup_ttl_s`, bounded by count alone in
memory and not at all in Redis: one caller's 300 results of 1.9 MB held 580 MiB of a
worker, and one caller filled a capped Redis for everyone. Now, past a caller's bytes or
the store's, the oldest whole reply of the caller holding the most gives way to its
summary (`reply_not_kept` for its repeats, never a second run), and a caller with nothing
left to shrink loses its own oldest record: a flood costs the flooder. Redis keeps the
same books across the fleet, settles them as records expire, and a Redis that evicts
records at its `maxmemory` is refused at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from tests.dedup.test_dedup import stored
from tests.support.harness import RedisServer
from tests.support.logwait import watching
from toolbus.dedup import Bounds, DedupStore, open_store
from toolbus.dedup.memory import MemoryStore
from toolbus.dedup.redis import RedisStore
from toolbus.dedup.store import StoreUnsafe, record_size
from toolbus.dedup.summary import kept_for_repeats
from toolbus.wire.contracts import Reply

TTL_S = 60.0
REPLY_CHARS = 3000  # a reply of ~3 KB: kept whole, with a summary that can stand in

Opener = Callable[[Bounds], AbstractAsyncContextManager[DedupStore]]


def reply_of(text: str) -> tuple[bytes, bytes | None]:
    """What a record keeps of a reply holding `text`: the reply and its summary."""
    reply = Reply(id="r", ok=True, tool="echo", duration_ms=1.0, result={"text": text})
    return kept_for_repeats(reply, 64 << 10)


@pytest_asyncio.fixture(params=["memory", "redis"])
async def opener(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[Opener]:
    """Opens a store of either kind with the bounds a test gives, as production does."""
    url = "memory" if request.param == "memory" else redis_server.url

    def opened(bounds: Bounds) -> AbstractAsyncContextManager[DedupStore]:
        return open_store(url, "w1", prefix=f"t{uuid.uuid4().hex[:8]}", bounds=bounds)

    yield opened


async def finish(store: DedupStore, key: str, text: str) -> tuple[bytes, bytes | None]:
    assert (await store.claim(key, TTL_S, fingerprint="f")).kind == "fresh"
    reply, summary = reply_of(text)
    await store.finish(key, reply, TTL_S, fingerprint="f", summary=summary)
    return reply, summary


async def kept(store: DedupStore, key: str) -> bytes | None:
    """The reply a repeat of `key` gets now (None: the record is gone, the call would run)."""
    claim = await store.claim(key, TTL_S, fingerprint="f")
    return claim.reply if claim.kind == "done" else None


async def test_a_callers_flood_shrinks_its_own_oldest_replies_never_anothers(
    opener: Opener,
) -> None:
    async with opener(Bounds(caller_max_bytes=80_000)) as store:
        quiet = {
            stored("kitchen", None, f"k{n}"): await finish(
                store, stored("kitchen", None, f"k{n}"), f"{n}" * REPLY_CHARS
            )
            for n in range(3)
        }
        flood = [stored("garage", None, f"g{n}") for n in range(60)]
        replies = [await finish(store, k, "g" * REPLY_CHARS) for k in flood]
        for k, (reply, _) in quiet.items():
            assert await kept(store, k) == reply  # whole: kitchen holds less than its bound
        assert await kept(store, flood[-1]) == replies[-1][0]  # the newest whole
        assert await kept(store, flood[0]) == replies[0][1]  # the oldest: its summary


async def test_past_the_stores_bytes_the_caller_holding_the_most_gives_way(
    opener: Opener,
) -> None:
    """Each caller is under its own bound, together over the store's: garage, which
    holds the most, shrinks; kitchen keeps everything (it holds less)."""
    async with opener(Bounds(max_bytes=60_000)) as store:
        quiet = [stored("kitchen", None, f"k{n}") for n in range(3)]
        quiet_replies = [await finish(store, k, "k" * REPLY_CHARS) for k in quiet]
        flood = [stored("garage", None, f"g{n}") for n in range(40)]
        flood_replies = [await finish(store, k, "g" * REPLY_CHARS) for k in flood]
        assert [await kept(store, k) for k in quiet] == [r for r, _ in quiet_replies]
        assert await kept(store, flood[0]) == flood_replies[0][1]
        assert await kept(store, flood[-1]) == flood_replies[-1][0]


async def test_a_caller_with_only_summaries_left_loses_its_own_oldest_record(
    opener: Opener,
) -> None:
    """Summaries cost bytes too: past its bound with nothing left to shrink, the caller's
    own oldest record goes (a repeat of it would run again, as after `dedup_ttl_s`)."""
    async with opener(Bounds(caller_max_bytes=8_000)) as store:
        booking = stored("kitchen", None, "order-43")
        booked, _ = await finish(store, booking, "k" * 100)
        flood = [stored("garage", None, f"g{n}") for n in range(40)]
        for k in flood:
            await finish(store, k, "g" * REPLY_CHARS)
        assert await kept(store, flood[0]) is None  # forgotten: its own oldest
        assert await kept(store, flood[-1]) is not None
        assert await kept(store, booking) == booked


async def test_a_running_call_never_gives_way(opener: Opener) -> None:
    async with opener(Bounds(caller_max_bytes=8_000, max_bytes=8_000)) as store:
        running = stored("garage", None, "long")
        await store.claim(running, TTL_S, fingerprint="f")
        for n in range(40):
            await finish(store, stored("garage", None, f"g{n}"), "g" * REPLY_CHARS)
        assert (await store.claim(running, TTL_S, fingerprint="f")).kind == "running"


def test_the_memory_ledger_counts_what_it_keeps() -> None:
    """The memory store's books after three callers' floods: within the bounds, and each
    live record counted once, at its size now (a shrunk one at its summary's)."""

    async def flood() -> MemoryStore:
        store = MemoryStore("w1", bounds=Bounds(caller_max_bytes=50_000, max_bytes=80_000))
        for caller in ("garage", "kitchen", "hall"):
            for n in range(100):
                await finish(store, stored(caller, None, f"{n}"), caller[0] * REPLY_CHARS)
        return store

    store = asyncio.run(flood())
    live = {k: r for k, r in store._records.items() if r.reply is not None}
    sizes = [record_size(k, r.reply or b"", r.summary, r.fingerprint) for k, r in live.items()]
    assert store.ledger.bytes == sum(sizes) <= 80_000
    assert store.ledger.records == len(live)
    assert any(r.summary is None and len(r.reply or b"") < 1000 for r in live.values())


# -- Redis: the books across the fleet, expiry, and a Redis that evicts ------------------


async def test_redis_books_are_settled_as_records_expire(redis_server: RedisServer) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(redis_server.url)
    try:
        async with RedisStore(redis_server.url, "w1", prefix=prefix) as store:
            for n in range(5):
                k = stored("garage", None, f"short{n}")
                await store.claim(k, 0.2, fingerprint="f")
                reply, summary = reply_of("x" * REPLY_CHARS)
                await store.finish(k, reply, 0.2, fingerprint="f", summary=summary)
            async with asyncio.timeout(5):
                while await client.exists(f"{prefix}:dedup:" + stored("garage", None, "short4")):
                    await asyncio.sleep(0.05)  # polling an expiry
            await finish(store, stored("kitchen", None, "last"), "y" * 10)
            total = int(await client.get(f"{prefix}:dedup-bytes") or 0)
            owners = await client.zrange(f"{prefix}:dedup-owners", 0, -1, withscores=True)
        assert owners == [(b"kitchen", float(total))]
    finally:
        await client.aclose()


async def test_redis_bounds_hold_across_workers(redis_server: RedisServer) -> None:
    """Two workers share one Redis: the books are the store's, not a worker's."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    bounds = Bounds(caller_max_bytes=80_000)
    async with (
        RedisStore(redis_server.url, "w1", prefix=prefix, bounds=bounds) as one,
        RedisStore(redis_server.url, "w2", prefix=prefix, bounds=bounds) as two,
    ):
        flood = [stored("garage", None, f"g{n}") for n in range(40)]
        replies = [
            await finish(one if n % 2 else two, k, "g" * REPLY_CHARS) for n, k in enumerate(flood)
        ]
        assert await kept(one, flood[0]) == replies[0][1]
        assert await kept(two, flood[-1]) == replies[-1][0]


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
async def test_a_redis_that_evicts_records_is_refused_at_start(policy: str) -> None:
    """With `allkeys-lru` one caller's flood evicted another's finished record, whose
    repeat then ran again: a worker does not start on such a Redis."""
    evicting = RedisServer("--maxmemory", "64mb", "--maxmemory-policy", policy)
    evicting.start()
    try:
        with pytest.raises(StoreUnsafe, match=policy):
            async with RedisStore(evicting.url, "w1", prefix="t"):
                pass
    finally:
        evicting.stop()


async def test_a_redis_smaller_than_the_bounds_is_warned_about() -> None:
    small = RedisServer("--maxmemory", "8mb")  # noeviction, Redis's default
    small.start()
    try:
        with watching("toolbus.dedup", level=logging.WARNING) as seen:
            async with RedisStore(small.url, "w1", prefix="t", bounds=Bounds(max_bytes=64 << 20)):
                pass
        assert any("maxmemory" in r.getMessage() for r in seen.records)
    finally:
        small.stop()


async def test_a_record_with_its_summary_or_shrunk_to_it_is_superseded_once(
    opener: Opener,
) -> None:
    """A provider's next `call_0` takes a finished record over: also one holding a
    summary beside its reply, and one the bounds shrank (in Redis re-encoded by its books).
    It used to find neither equal to what it rebuilt, and ran unclaimed: its repeats ran
    again (the review of issue 29)."""
    async with opener(Bounds(caller_max_bytes=8_000)) as store:
        whole = stored("kitchen", None, "call_0")
        await finish(store, whole, "w" * REPLY_CHARS)  # a reply over 1 KiB: a summary beside
        shrunk = stored("garage", None, "call_0")
        _, summary = await finish(store, shrunk, "s" * REPLY_CHARS)
        for n in range(3):  # garage past its bound: its oldest, call_0, shrinks
            await finish(store, stored("garage", None, f"g{n}"), "g" * REPLY_CHARS)
        assert await kept(store, shrunk) == summary
        for k in (whole, shrunk):
            seen = await store.claim(k, TTL_S, fingerprint="next-turn")
            assert seen.kind == "done"
            assert await store.supersede(k, seen, TTL_S, fingerprint="next-turn")
            again = await store.claim(k, TTL_S, fingerprint="next-turn")
            assert (again.kind, again.fingerprint) == ("running", "next-turn")
