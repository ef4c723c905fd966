"""An emptied Redis (issue 29.4): written back where a live worker knows, refused where none does.

Restarted without its data, a Redis used to forget which calls ran, and 8 of 8 retried
calls ran twice. Now every worker notices (its next claim checks the store's epoch),
writes back its journal, and while a worker seen at work before has not (it stopped, or
died), an id the store does not know may be one of its calls: a tool safe to repeat runs,
any other is refused `unavailable` (`store: "emptied"`) until that worker's records would
have expired anyway. Real redis-server processes, restarted empty on the same port.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest
from redis.exceptions import RedisError

from tests.dedup.test_dedup import stored
from tests.support.harness import RedisServer
from tests.support.logwait import watching
from toolbus.dedup import Once
from toolbus.dedup.redis import RedisStore
from toolbus.dedup.store import Done

ASKS = "ask-a"


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


async def finished(store: RedisStore, key: str, ttl_s: float) -> None:
    assert (await store.claim(key, ttl_s, fingerprint=ASKS)).kind == "fresh"
    await store.finish(key, b'{"id":"r","ok":true,"duration_ms":1}', ttl_s, fingerprint=ASKS)


def restart_empty(server: RedisServer) -> None:
    server.stop()
    server.start()  # the same port, nothing kept


async def test_a_live_workers_calls_and_runs_are_written_back(own_redis: RedisServer) -> None:
    """b's call finished and a's still running: after the restart a repeat of either,
    wherever it lands, is a repeat (its reply, or a wait for the run), not a new run."""
    p = prefix()
    async with (
        RedisStore(own_redis.url, "a", prefix=p, ttl_s=60) as a,
        RedisStore(own_redis.url, "b", prefix=p, ttl_s=60) as b,
    ):
        done, running = stored("kitchen", None, "done"), stored("kitchen", None, "running")
        await finished(b, done, 60)
        assert (await a.claim(running, 60, fingerprint=ASKS)).kind == "fresh"
        restart_empty(own_redis)
        assert (await a.claim(done, 60, fingerprint=ASKS)).kind == "done"
        assert (await b.claim(running, 60, fingerprint=ASKS)).kind == "running"
        assert (await a.claim(stored("kitchen", None, "new"), 60, fingerprint=ASKS)).kind == (
            "fresh"  # both were alive and wrote back: an unknown id is new
        )


async def test_a_stopped_workers_lost_calls_leave_unknown_ids_in_doubt_until_they_expire(
    own_redis: RedisServer,
) -> None:
    """a ran calls and stopped; its records are lost with the restart and no live worker
    knows them: b's claims of ids it does not know are in doubt for as long as a's records
    would have lived, then new again."""
    ttl_s = 3.0
    p = prefix()
    async with RedisStore(own_redis.url, "a", prefix=p, ttl_s=ttl_s) as a:
        await finished(a, stored("kitchen", None, "lost"), ttl_s)
        async with RedisStore(own_redis.url, "b", prefix=p, ttl_s=ttl_s) as b:
            await a.__aexit__(None, None, None)  # a stops; its records stay, for now
            with watching("toolbus.dedup", "dedup store emptied", logging.ERROR) as emptied:
                restart_empty(own_redis)
                claim = await b.claim(stored("kitchen", None, "lost"), ttl_s, fingerprint=ASKS)
            assert claim.kind == "doubtful"
            assert time.time() < claim.doubt_until <= time.time() + ttl_s
            assert len(emptied.records) == 1
            await b.release(stored("kitchen", None, "lost"), fingerprint=ASKS)
            async with asyncio.timeout(ttl_s + 5):
                while (
                    await b.claim(stored("kitchen", None, "later"), ttl_s, fingerprint=ASKS)
                ).kind == "doubtful":
                    await b.release(stored("kitchen", None, "later"), fingerprint=ASKS)
                    await asyncio.sleep(0.2)  # polling the window's end
            assert (
                await b.claim(stored("kitchen", None, "new"), ttl_s, fingerprint=ASKS)
            ).kind == ("fresh")


async def test_in_doubt_a_tool_safe_to_repeat_runs_and_any_other_is_refused_not_run(
    own_redis: RedisServer,
) -> None:
    p = prefix()
    async with RedisStore(own_redis.url, "a", prefix=p, ttl_s=30) as a:
        await finished(a, stored("kitchen", None, "x"), 30)
        async with RedisStore(own_redis.url, "b", prefix=p, ttl_s=30) as b:
            await a.__aexit__(None, None, None)
            restart_empty(own_redis)
            once = Once(b, 30, idempotent=lambda tool: tool == "datetime")
            key = stored("kitchen", None, "switch")
            refused = await once.begin(key, ASKS, "light_on", 5.0)
            safe = await once.begin(stored("kitchen", None, "clock"), ASKS, "datetime", 5.0)
            assert refused.key is None and refused.error is not None
            assert refused.error.code.value == "unavailable"
            assert refused.error.details["store"] == "emptied"
            assert 0 < refused.error.details["retry_after_ms"] <= 30_000
            assert safe.key is not None  # runs
            # The refused claim was withdrawn: nothing holds the id as running.
            assert (await b.claim(key, 30, fingerprint=ASKS)).kind == "doubtful"


async def test_a_worker_starting_during_the_recovery_keeps_the_doubt(
    own_redis: RedisServer,
) -> None:
    """c starts after the restart: it never knew the lost records, but reads the recovery
    the others recorded, so it does not run an unknown id as new either."""
    p = prefix()
    async with RedisStore(own_redis.url, "a", prefix=p, ttl_s=30) as a:
        await finished(a, stored("kitchen", None, "x"), 30)
        async with RedisStore(own_redis.url, "b", prefix=p, ttl_s=30) as b:
            await a.__aexit__(None, None, None)
            restart_empty(own_redis)
            assert (await b.claim(stored("kitchen", None, "y"), 30, fingerprint=ASKS)).kind == (
                "doubtful"
            )
            async with RedisStore(own_redis.url, "c", prefix=p, ttl_s=30) as c:
                claim = await c.claim(stored("kitchen", None, "z"), 30, fingerprint=ASKS)
                assert claim.kind == "doubtful"


async def test_a_worker_started_on_the_emptied_store_joins_when_the_others_notice(
    own_redis: RedisServer,
) -> None:
    """c starts on the emptied Redis before b notices, so c makes the new epoch and finds
    no recovery: it joins at its next heartbeat once b records one, and b's doubt ends
    when a's records would have (c, beating since, never extends it: it did, endlessly)."""
    ttl_s = 30.0
    p = prefix()
    async with RedisStore(own_redis.url, "a", prefix=p, ttl_s=ttl_s) as a:
        await finished(a, stored("kitchen", None, "x"), ttl_s)
        async with RedisStore(own_redis.url, "b", prefix=p, ttl_s=ttl_s) as b:
            await a.__aexit__(None, None, None)
            a_gone = time.time()
            restart_empty(own_redis)
            async with RedisStore(own_redis.url, "c", prefix=p, ttl_s=ttl_s) as c:
                doubted = await b.claim(stored("kitchen", None, "y"), ttl_s, fingerprint=ASKS)
                assert doubted.kind == "doubtful"
                assert doubted.doubt_until <= a_gone + ttl_s
                async with asyncio.timeout(10):  # c's next heartbeat (2 s) joins
                    while (
                        claim := await c.claim(
                            stored("kitchen", None, "z"), ttl_s, fingerprint=ASKS
                        )
                    ).kind != "doubtful":
                        await c.release(stored("kitchen", None, "z"), fingerprint=ASKS)
                        await asyncio.sleep(0.2)  # polling c's heartbeat
                assert claim.doubt_until <= a_gone + ttl_s
                again = await b.claim(stored("kitchen", None, "w"), ttl_s, fingerprint=ASKS)
                assert again.doubt_until <= a_gone + ttl_s  # c beating does not extend it


async def test_a_write_back_replaces_a_claim_in_doubt_made_before_it(
    redis_server: RedisServer,
) -> None:
    """b claimed x in doubt (and will withdraw it) before a wrote back its run of x: a's
    record replaces b's claim, and b's withdrawal leaves it. It used to keep b's claim,
    which b then deleted: the next repeat of x ran again."""
    p = prefix()
    async with (
        RedisStore(redis_server.url, "a", prefix=p) as a,
        RedisStore(redis_server.url, "b", prefix=p) as b,
    ):
        x = stored("kitchen", None, "x")
        assert (await b.claim(x, 60, fingerprint=ASKS)).kind == "fresh"  # stands for b's doubt
        reply = b'{"id":"x","ok":true,"duration_ms":1}'
        done = Done(reply, ASKS).to_json()
        await a._write_back([(x, done, 60.0)])
        await b.release(x, fingerprint=ASKS)
        claim = await b.claim(x, 60, fingerprint=ASKS)
        assert (claim.kind, claim.reply) == ("done", reply)


async def test_a_recovery_that_failed_is_made_again_at_the_next_heartbeat(
    own_redis: RedisServer,
) -> None:
    p = prefix()
    async with RedisStore(own_redis.url, "a", prefix=p, ttl_s=60) as a:
        await finished(a, stored("kitchen", None, "x"), 60)
        fleet = a._fleet
        write_back = fleet._write_back
        failures: list[list[tuple[str, str, float]]] = []

        async def fails_once(entries: list[tuple[str, str, float]]) -> None:
            if not failures:
                failures.append(entries)
                raise RedisError("timed out writing back")
            await write_back(entries)

        fleet._write_back = fails_once
        restart_empty(own_redis)
        with pytest.raises(RedisError):  # nothing runs while a's records are not back
            await a.claim(stored("kitchen", None, "y"), 60, fingerprint=ASKS)
        assert (await a.claim(stored("kitchen", None, "x"), 60, fingerprint=ASKS)).kind == "done"
        assert len(failures) == 1  # the claim made the write-back again, and it went through
