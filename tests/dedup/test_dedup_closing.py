"""Closing a claim against a store that fails, stalls or changed meanwhile (issue 23).

A reply or a release the store does not take is kept by the worker (`KeptReplies`) and
written again; so is the withdrawal of a claim that failed but may land late. Late
writes are compare-and-set in both stores, so they never touch a record another run
wrote since; kept entries live no longer than their records would; and the log lines
about them name the request id and its caller, never a reply topic.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from tests.dedup.test_dedup import stored
from tests.support.harness import RedisServer
from tests.support.logwait import watching
from toolbus.dedup import DedupStore, Once, fingerprint
from toolbus.dedup.kept import KeptReplies
from toolbus.dedup.redis import RedisStore
from toolbus.wire.contracts import Reply

TTL_S = 60.0
ASKS = "ask-a"


def answered(text: str) -> Reply:
    return Reply(id="r", ok=True, tool="light", duration_ms=1.0, result={"text": text})


def stored_reply(text: str) -> bytes:
    """`answered(text)` as a record keeps it (what a repeat is sent)."""
    return answered(text).model_dump_json(by_alias=True).encode()


def kept_over(server: RedisServer, prefix: str, worker_id: str = "w1") -> KeptReplies:
    """What production opens, with short bounds: a frozen Redis fails a write in ~1 s."""
    return KeptReplies(
        RedisStore(server.url, worker_id, prefix=prefix, timeout_s=0.5), write_timeout_s=1.0
    )


# -- compare and set: a late close never touches another worker's record ---------------


async def test_a_late_release_or_reply_leaves_a_record_taken_over_meanwhile(
    workers: Callable[[str], RedisStore], redis_server: RedisServer
) -> None:
    """w1's heartbeat lapsed (a stall), w2 took its run over: w1's release or reply,
    arriving late, must not delete or overwrite w2's run (they used to). A reply over a
    record gone meanwhile (expired, a store emptied) is still written: it is the truth."""
    w1, w2 = await workers("w1").__aenter__(), await workers("w2").__aenter__()
    gone = uuid.uuid4().hex
    await w1.claim(gone, TTL_S)
    client = aioredis.from_url(redis_server.url)
    try:
        await client.delete(w1._key(gone))
    finally:
        await client.aclose()
    await w1.finish(gone, b"reply", TTL_S)
    assert (await w1.claim(gone, TTL_S)).reply == b"reply"
    for close in ("release", "finish"):
        k = uuid.uuid4().hex
        assert (await w1.claim(k, TTL_S)).kind == "fresh"
        seen = await w2.claim(k, TTL_S)
        assert seen.started is not None
        assert await w2.take_over(k, seen.started, TTL_S)
        if close == "release":
            await w1.release(k)
        else:
            await w1.finish(k, b"late", TTL_S)
        now = await w1.claim(k, TTL_S)
        assert now.kind == "running" and now.started is not None, close
        assert now.started.worker_id == "w2", close


async def test_a_claim_outliving_its_ttl_never_closes_the_next_claim_of_its_key(
    store: DedupStore,
) -> None:
    """Turn 1's `call_0` runs past `dedup_ttl_s`; turn 2's `call_0` (another request)
    claims the key afresh. Turn 1's late reply must not close turn 2's run (the memory
    store gave turn 2's waiting repeat turn 1's reply, and replayed it to every later
    repeat), nor its late release free it (turn 2's repeat ran a second time)."""
    k = uuid.uuid4().hex
    assert (await store.claim(k, 0.05, fingerprint="turn-1")).kind == "fresh"
    async with asyncio.timeout(5):
        while (await store.claim(k, TTL_S, fingerprint="turn-2")).kind != "fresh":
            await asyncio.sleep(0.01)  # polling a TTL: no event marks an expiry
    repeat = asyncio.create_task(store.wait(k, 30, fingerprint="turn-2"), name="repeat")
    await asyncio.sleep(0)  # it waits (memory; Redis may still subscribe: either order holds)
    await store.finish(k, b"reply-1", TTL_S, fingerprint="turn-1")
    await store.release(k, fingerprint="turn-1")
    running = await store.claim(k, TTL_S, fingerprint="turn-2")
    assert (running.kind, running.fingerprint) == ("running", "turn-2")
    assert not repeat.done()
    await store.finish(k, b"reply-2", TTL_S, fingerprint="turn-2")
    async with asyncio.timeout(10):
        assert await repeat == b"reply-2"
    done = await store.claim(k, TTL_S, fingerprint="turn-2")
    assert (done.kind, done.reply, done.fingerprint) == ("done", b"reply-2", "turn-2")


async def test_turn_1_s_late_reply_never_reaches_turn_2_s_repeats_of_call_0(
    store: DedupStore,
) -> None:
    """Dedup x provider call ids: the same `call_0` in two turns (other correlation data,
    so other requests). Turn 1 runs past its TTL, turn 2 claims `call_0` afresh and its
    retry waits; turn 1's reply then comes: turn 2's retries get turn 2's reply."""
    k = stored("alice", None, "call_0")
    turn_1 = fingerprint("light", {"on": True}, b"corr-1")
    turn_2 = fingerprint("light", {"on": False}, b"corr-2")
    late = Once(store, 0.05, idempotent=lambda tool: False)  # a TTL shorter than the call
    once = Once(store, TTL_S, idempotent=lambda tool: False)
    first = await late.begin(k, turn_1, "light", 5.0, provider_id=True)
    assert first.key is not None
    async with asyncio.timeout(5):
        while (second := await once.begin(k, turn_2, "light", 5.0, provider_id=True)).key is None:
            await asyncio.sleep(0.01)  # polling a TTL: meanwhile turn 2 runs unclaimed
    retry = asyncio.create_task(once.begin(k, turn_2, "light", 30.0, provider_id=True))
    await asyncio.sleep(0)  # it waits (memory; Redis may still subscribe: either order holds)
    await late.finish(first, answered("on"))
    await late.release(first)
    assert not retry.done()
    await once.finish(second, answered("off"))
    async with asyncio.timeout(10):
        assert (await retry).reply == stored_reply("off")
    again = await once.begin(k, turn_2, "light", 5.0, provider_id=True)
    assert again.reply == stored_reply("off")


async def test_a_late_release_of_a_finished_run_leaves_its_reply(store: DedupStore) -> None:
    k = uuid.uuid4().hex
    await store.claim(k, TTL_S, fingerprint=ASKS)
    await store.finish(k, b"reply", TTL_S, fingerprint=ASKS)
    await store.release(k, fingerprint=ASKS)  # a release kept and written after the reply
    assert (await store.claim(k, TTL_S, fingerprint=ASKS)).reply == b"reply"


async def test_a_release_of_another_request_s_run_leaves_it(store: DedupStore) -> None:
    w1 = store
    k = uuid.uuid4().hex
    await w1.claim(k, TTL_S, fingerprint="ask-b")
    await w1.release(k, fingerprint=ASKS)  # not the run it claimed
    assert (await w1.claim(k, TTL_S, fingerprint="ask-b")).kind == "running"
    await w1.release(k, fingerprint="ask-b")
    assert (await w1.claim(k, TTL_S, fingerprint="ask-b")).kind == "fresh"


# -- a release the store does not take ---------------------------------------------------


async def test_a_failed_release_is_kept_and_written_once_redis_is_back(
    own_redis: RedisServer,
) -> None:
    """A call refused before reaching its tool while Redis stalls: the release fails, is
    kept, and is written once Redis is back, so another worker's repeat runs the call
    (the record used to stay `started` by a live worker: `timeout` for the whole TTL)."""
    assert own_redis.process is not None
    prefix = f"t{uuid.uuid4().hex[:8]}"
    k = uuid.uuid4().hex
    async with kept_over(own_redis, prefix) as w1, kept_over(own_redis, prefix, "w2") as w2:
        assert (await w1.claim(k, TTL_S)).kind == "fresh"
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            await w1.release(k)  # fails within its bound, and is kept
            assert w1.kept() == 1
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(30):
            await w1.all_written()
        assert w1.kept() == 0
        assert (await w2.claim(k, TTL_S)).kind == "fresh"


async def test_a_repeat_here_meanwhile_releases_first_then_claims(own_redis: RedisServer) -> None:
    """A repeat reaching this worker while its release is kept: with Redis still away it
    fails (the store is unreachable, nothing runs); once Redis is back it releases the
    claim at once and runs (it is not told the call still runs, nor that it ran)."""
    assert own_redis.process is not None
    prefix = f"t{uuid.uuid4().hex[:8]}"
    k = uuid.uuid4().hex
    async with kept_over(own_redis, prefix) as w1:
        await w1.claim(k, TTL_S)
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            await w1.release(k)
            with pytest.raises((TimeoutError, redis.exceptions.RedisError)):
                await w1.claim(k, TTL_S)
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(30):
            assert (await w1.claim(k, TTL_S)).kind == "fresh"


# -- a claim the store did not answer ----------------------------------------------------


async def test_a_failed_claim_that_lands_late_is_withdrawn(own_redis: RedisServer) -> None:
    """Redis frozen: the claim times out and the call is answered `unavailable` (nothing
    ran). Resumed, Redis runs the queued SET: a `started` record of this live worker for
    a call that never ran (its repeats got `timeout`, then `in_doubt`). The worker keeps
    the withdrawal of exactly what that claim wrote, so a repeat elsewhere runs."""
    assert own_redis.process is not None
    prefix = f"t{uuid.uuid4().hex[:8]}"
    k = uuid.uuid4().hex
    async with kept_over(own_redis, prefix) as w1, kept_over(own_redis, prefix, "w2") as w2:
        await w1.claim(uuid.uuid4().hex, TTL_S)  # a pooled connection: the SET is queued
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises((TimeoutError, redis.exceptions.RedisError)):
                await w1.claim(k, TTL_S, fingerprint=ASKS)
            assert w1.kept() == 1
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(30):
            await w1.all_written()
        assert w1.kept() == 0
        assert (await w2.claim(k, TTL_S, fingerprint=ASKS)).kind == "fresh"


async def test_a_withdrawal_spares_another_claim_of_the_same_process(
    workers: Callable[[str], RedisStore],
) -> None:
    """Only exactly what the failed claim wrote goes: a later claim of the same worker
    process and request (another `started_at`) stays."""
    w1 = await workers("w1").__aenter__()
    k = uuid.uuid4().hex
    failed = w1._started(ASKS)
    assert (await w1.claim(k, TTL_S, fingerprint=ASKS)).kind == "fresh"
    await w1.unclaim(k, failed)
    assert (await w1.claim(k, TTL_S, fingerprint=ASKS)).kind == "running"


async def test_a_repeat_here_withdraws_a_failed_claim_first(own_redis: RedisServer) -> None:
    """A repeat reaching this worker while the withdrawal is kept: with Redis away it
    fails (nothing runs); once Redis is back it withdraws the late claim at once and runs
    (it is not told the call still runs)."""
    assert own_redis.process is not None
    prefix = f"t{uuid.uuid4().hex[:8]}"
    k = uuid.uuid4().hex
    async with kept_over(own_redis, prefix) as w1:
        await w1.claim(uuid.uuid4().hex, TTL_S)
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            for _ in range(2):
                with pytest.raises((TimeoutError, redis.exceptions.RedisError)):
                    await w1.claim(k, TTL_S, fingerprint=ASKS)
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(30):
            assert (await w1.claim(k, TTL_S, fingerprint=ASKS)).kind == "fresh"


# -- housekeeping ------------------------------------------------------------------------


async def test_a_kept_reply_lives_no_longer_than_its_record(own_redis: RedisServer) -> None:
    """Redis gone: a reply kept with a short TTL stops answering repeats once the TTL has
    passed, while an older one is still retried, and is never written late (later entries
    used to outlive their TTL behind the oldest, and kept answering `done`)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    old, short = uuid.uuid4().hex, uuid.uuid4().hex
    async with kept_over(own_redis, prefix) as w1:
        await w1.claim(old, TTL_S, fingerprint=ASKS)
        await w1.claim(short, TTL_S, fingerprint=ASKS)
        own_redis.stop()
        await w1.finish(old, b"old", TTL_S, fingerprint=ASKS)
        await w1.finish(short, b"short", 0.2, fingerprint=ASKS)
        assert w1.kept() == 2
        async with asyncio.timeout(10):  # polling a TTL: no event marks an expiry
            while True:
                try:
                    seen = await w1.claim(short, TTL_S, fingerprint=ASKS)
                except redis.exceptions.RedisError:
                    break  # asked the store: the kept reply is gone
                assert (seen.kind, seen.reply) == ("done", b"short")
                await asyncio.sleep(0.02)
        assert (await w1.claim(old, TTL_S, fingerprint=ASKS)).reply == b"old"
        own_redis.start()  # empty: the old reply is written over nothing
        async with asyncio.timeout(30):
            await w1.all_written()
        assert w1.kept() == 0
        async with RedisStore(own_redis.url, "w2", prefix=prefix) as w2:
            assert (await w2.claim(old, TTL_S, fingerprint=ASKS)).reply == b"old"
            assert (await w2.claim(short, TTL_S, fingerprint=ASKS)).kind == "fresh"


async def test_all_written_ends_once_the_writer_has_stopped(own_redis: RedisServer) -> None:
    """A worker stopping with replies unwritten cancels its writer: whoever waits for
    them is told at once (it used to wait forever)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    k = uuid.uuid4().hex
    w1 = kept_over(own_redis, prefix)
    async with w1:
        await w1.claim(k, TTL_S, fingerprint=ASKS)
        own_redis.stop()
        await w1.finish(k, b"reply", TTL_S, fingerprint=ASKS)
        assert w1.kept() == 1
    async with asyncio.timeout(10):
        await w1.all_written()
    assert w1.kept() == 1  # not written: said so when stopping


# -- what the log lines say --------------------------------------------------------------


async def test_log_lines_name_the_request_and_caller_never_a_reply_topic(
    own_redis: RedisServer,
) -> None:
    """An anonymous client's reply topic may tell who it is: the kept-reply and take-over
    lines name the request id and "anonymous" instead (they used to log the store key)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    topic = "tb/reply/alice-laptop"
    async with RedisStore(own_redis.url, "w-dead", prefix=prefix) as dead:
        await dead.claim(stored(None, topic, "again"), TTL_S, fingerprint=ASKS)
    with watching("toolbus.dedup", level=logging.INFO) as seen:
        async with kept_over(own_redis, prefix) as w1:
            once = Once(w1, TTL_S, idempotent=lambda tool: True)
            taken = await once.begin(stored(None, topic, "again"), ASKS, "echo", 5.0)
            assert taken.key is not None  # the dead worker's run, taken over
            fresh = await once.begin(stored(None, topic, "kept"), ASKS, "echo", 5.0)
            own_redis.stop()
            await once.finish(fresh, answered("{}"))
            await once.finish(taken, answered("{}"))
    lines = [r.getMessage() for r in seen.records]
    assert any("'again'" in line and "anonymous" in line for line in lines), lines
    assert any("'kept'" in line and "anonymous" in line for line in lines), lines
    assert not any("alice-laptop" in line for line in lines), lines


def test_the_memory_store_closes_a_run_without_suspending() -> None:
    """`MemoryStore.in_process`: the answerer awaits its close unshielded (no task of its
    own), which is sound only while a claim, a finish and a release never suspend: a
    coroutine that suspended here would hand its caller's cancel a half-closed record."""
    from toolbus.dedup import MemoryStore
    from toolbus.dedup.memory import closes_at_once

    store = MemoryStore("w1")
    assert closes_at_once(store)

    class Slow(MemoryStore):  # a subclass may wait in its close: shielded as any store
        async def finish(self, key: str, reply: bytes, ttl_s: float, **kept: Any) -> None:
            await asyncio.sleep(0)
            await super().finish(key, reply, ttl_s, **kept)

    assert not closes_at_once(Slow("w1")) and not closes_at_once(object())

    def at_once(step: object) -> object:
        coroutine = step  # a coroutine object: run it to its end in one step, or fail
        assert asyncio.iscoroutine(coroutine)
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        coroutine.close()
        raise AssertionError("it suspended")

    mine = fingerprint("light", {"on": True})
    claimed = at_once(store.claim("k1", TTL_S, fingerprint=mine))
    assert getattr(claimed, "kind", None) == "fresh"
    at_once(store.finish("k1", stored_reply("x"), TTL_S, fingerprint=mine))
    assert getattr(at_once(store.claim("k1", TTL_S, fingerprint=mine)), "kind", None) == "done"
    at_once(store.claim("k2", TTL_S, fingerprint=mine))
    at_once(store.release("k2", fingerprint=mine))
    assert getattr(at_once(store.claim("k2", TTL_S, fingerprint=mine)), "kind", None) == "fresh"
