"""Dedup stores: the same contract from the in-process store and from a real Redis.

Claims, replies, releases and waits behave alike in both; only Redis sees other workers,
so runs cut short by a dead worker (orphans, take-overs) are Redis cases.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from tests.support.harness import RedisServer, free_port, metric_points
from tests.support.logwait import watching
from toolbus.dedup import DedupStore, MemoryStore, Once, open_store
from toolbus.dedup.redis import RedisStore
from toolbus.dedup.store import StoreUnreachable
from toolbus.observability.metrics import Metrics
from toolbus.wire.contracts import Reply

TTL_S = 60.0


def key() -> str:
    return uuid.uuid4().hex


def stored(caller: str | None, reply_topic: str | None, ident: str) -> str:
    """The store key of a request `Once` deduplicates."""
    k = Once.key(caller, reply_topic, ident)
    assert k is not None
    return k


async def test_claim_then_repeat_then_finish(store: DedupStore) -> None:
    k = key()
    assert (await store.claim(k, TTL_S)).kind == "fresh"
    running = await store.claim(k, TTL_S)
    assert running.kind == "running" and running.started is not None
    assert running.started.worker_id == "w1"
    await store.finish(k, b'{"id": "1"}', TTL_S)
    done = await store.claim(k, TTL_S)
    assert (done.kind, done.reply) == ("done", b'{"id": "1"}')


async def test_a_released_claim_is_free_again(store: DedupStore) -> None:
    k = key()
    await store.claim(k, TTL_S)
    await store.release(k)
    assert (await store.claim(k, TTL_S)).kind == "fresh"


async def test_a_waiter_gets_the_reply_when_it_is_stored(store: DedupStore) -> None:
    k = key()
    await store.claim(k, TTL_S)
    waiting = asyncio.create_task(store.wait(k, timeout_s=10), name="dedup-waiter")
    await asyncio.sleep(0)  # let it subscribe; the reply below may come before or after
    await store.finish(k, b"reply", TTL_S)
    async with asyncio.timeout(10):
        assert await waiting == b"reply"


async def test_a_wait_is_bounded(store: DedupStore) -> None:
    k = key()
    await store.claim(k, TTL_S)
    async with asyncio.timeout(5):
        assert await store.wait(k, timeout_s=0.05) is None


async def test_records_expire(store: DedupStore) -> None:
    k = key()
    await store.claim(k, 0.05)
    async with asyncio.timeout(5):
        while (await store.claim(k, TTL_S)).kind != "fresh":
            await asyncio.sleep(0.01)  # polling a TTL: no event marks an expiry


async def test_a_record_keeps_what_its_call_asked_for(store: DedupStore) -> None:
    k = key()
    assert (await store.claim(k, TTL_S, fingerprint="ask-a")).kind == "fresh"
    running = await store.claim(k, TTL_S, fingerprint="ask-b")
    assert (running.kind, running.fingerprint) == ("running", "ask-a")
    assert running.asks("ask-a") and not running.asks("ask-b")
    await store.finish(k, b"reply-a", TTL_S, fingerprint="ask-a")
    done = await store.claim(k, TTL_S, fingerprint="ask-b")
    assert (done.kind, done.reply, done.fingerprint) == ("done", b"reply-a", "ask-a")


async def test_a_waiter_is_never_given_another_request_s_reply(store: DedupStore) -> None:
    k = key()
    await store.claim(k, TTL_S, fingerprint="ask-a")
    async with asyncio.timeout(5):  # at once: not after its 60 s
        assert await store.wait(k, 60.0, fingerprint="ask-b") is None
    await store.finish(k, b"reply-a", TTL_S, fingerprint="ask-a")
    assert await store.wait(k, 60.0, fingerprint="ask-b") is None
    assert await store.wait(k, 60.0, fingerprint="ask-a") == b"reply-a"


async def test_a_finished_record_is_superseded_by_one_other_request(store: DedupStore) -> None:
    k = key()
    await store.claim(k, TTL_S, fingerprint="ask-a")
    await store.finish(k, b"reply-a", TTL_S, fingerprint="ask-a")
    seen = await store.claim(k, TTL_S, fingerprint="ask-b")
    results = await asyncio.gather(
        store.supersede(k, seen, TTL_S, fingerprint="ask-b"),
        store.supersede(k, seen, TTL_S, fingerprint="ask-c"),
    )
    assert sorted(results) == [False, True]  # compare-and-set: one takes it
    winner = "ask-b" if results[0] else "ask-c"
    now = await store.claim(k, TTL_S, fingerprint="ask-a")
    assert (now.kind, now.fingerprint) == ("running", winner)
    assert not await store.supersede(k, now, TTL_S, fingerprint="ask-a")  # not a reply


# -- other workers: Redis only ----------------------------------------------------------


async def test_a_run_of_a_live_worker_is_running_for_the_others(
    workers: Callable[[str], RedisStore],
) -> None:
    a, b = await workers("a").__aenter__(), await workers("b").__aenter__()
    k = key()
    await a.claim(k, TTL_S)
    seen = await b.claim(k, TTL_S)
    assert seen.kind == "running" and seen.started is not None and seen.started.worker_id == "a"


async def test_a_run_of_a_stopped_worker_is_orphaned_and_taken_over_once(
    workers: Callable[[str], RedisStore],
) -> None:
    a = await workers("a").__aenter__()
    b = await workers("b").__aenter__()
    c = await workers("c").__aenter__()
    k = key()
    await a.claim(k, TTL_S)
    await a.__aexit__(None, None, None)  # its heartbeat key goes with it
    orphan = await b.claim(k, TTL_S)
    assert orphan.kind == "orphaned" and orphan.started is not None
    results = await asyncio.gather(
        b.take_over(k, orphan.started, TTL_S), c.take_over(k, orphan.started, TTL_S)
    )
    assert sorted(results) == [False, True]  # compare-and-set: exactly one runs it again


async def test_the_same_worker_id_restarted_sees_its_old_runs_orphaned(
    workers: Callable[[str], RedisStore],
) -> None:
    old = await workers("w").__aenter__()
    k = key()
    await old.claim(k, TTL_S)
    new = await workers("w").__aenter__()  # a new process under the same id: old is dead
    assert (await new.claim(k, TTL_S)).kind == "orphaned"


async def test_a_waiter_stops_waiting_when_the_running_worker_dies(
    workers: Callable[[str], RedisStore],
) -> None:
    old, other = await workers("w").__aenter__(), await workers("o").__aenter__()
    k = key()
    await old.claim(k, TTL_S)
    waiting = asyncio.create_task(other.wait(k, 60.0), name="waiter")
    await workers("w").__aenter__()  # restarted under its id: the old run is dead
    async with asyncio.timeout(10):  # a heartbeat's look, not the 60 s deadline
        assert await waiting is None
    assert (await other.claim(k, TTL_S)).kind == "orphaned"


def test_memory_store_is_the_default() -> None:
    assert isinstance(open_store("memory", "w", prefix="p"), MemoryStore)


async def test_the_memory_store_forgets_the_oldest_finished_calls_beyond_its_bound() -> None:
    """A flood of ids costs at most `max_records` replies; a call still running is
    never forgotten (its repeat would run it a second time)."""
    async with MemoryStore("w1", max_records=3) as bounded:
        await bounded.claim("long", TTL_S)  # still running throughout
        for n in range(5):
            await bounded.claim(f"k{n}", TTL_S)
            await bounded.finish(f"k{n}", b"{}", TTL_S)
        kinds = {k: (await bounded.claim(k, TTL_S)).kind for k in ("long", "k3", "k4")}
        assert kinds == {"long": "running", "k3": "done", "k4": "done"}
        assert (await bounded.claim("k0", TTL_S)).kind == "fresh"  # forgotten


async def test_a_call_that_finishes_late_is_forgotten_last() -> None:
    """Eviction goes by when a call finished: a long call claimed first and finished
    last is the one its requester is most likely to repeat."""
    async with MemoryStore("w1", max_records=3) as bounded:
        await bounded.claim("slow", TTL_S)
        for n in range(2):
            await bounded.claim(f"k{n}", TTL_S)
            await bounded.finish(f"k{n}", b"{}", TTL_S)
        await bounded.finish("slow", b"{}", TTL_S)
        await bounded.claim("new", TTL_S)  # over the bound: one finished record goes
        assert (await bounded.claim("slow", TTL_S)).kind == "done"
        assert (await bounded.claim("k1", TTL_S)).kind == "done"


async def test_records_written_before_fingerprints_are_still_repeats(
    workers: Callable[[str], RedisStore], redis_server: RedisServer
) -> None:
    """A fleet mid-upgrade: an older worker's records carry no fingerprint. They match
    any request, as they did, and an orphaned one is still taken over exactly once."""
    store = await workers("new").__aenter__()
    k = key()
    legacy_done = json.dumps({"state": "done", "reply": "{}"})
    legacy_run = {"state": "started", "worker_id": "old", "incarnation": "i", "started_at": 1.5}
    client = aioredis.from_url(redis_server.url)
    try:
        await client.set(store._key(k), legacy_done)
        done = await store.claim(k, TTL_S, fingerprint="ask-a")
        assert (done.kind, done.reply) == ("done", b"{}") and done.asks("ask-a")
        await client.set(store._key(k), json.dumps(legacy_run))
        orphan = await store.claim(k, TTL_S, fingerprint="ask-a")
        assert orphan.kind == "orphaned" and orphan.asks("ask-a") and orphan.started is not None
        assert await store.take_over(k, orphan.started, TTL_S, fingerprint="ask-a")
        assert (await store.claim(k, TTL_S, fingerprint="ask-b")).fingerprint == "ask-a"
    finally:
        await client.aclose()


async def test_the_memory_bound_is_shared_fairly_between_callers() -> None:
    """At the bound a record goes from a caller holding at least its even share: a flood
    of one caller's ids forgets its own oldest, while a quieter caller keeps its calls."""
    async with MemoryStore("w1", max_records=10) as bounded:
        quiet = [stored("kitchen", None, f"k{n}") for n in range(3)]
        for k in quiet:
            await bounded.claim(k, TTL_S)
            await bounded.finish(k, b"{}", TTL_S)
        flood = [stored("garage", None, f"g{n}") for n in range(1000)]
        for k in flood:
            await bounded.claim(k, TTL_S)
            await bounded.finish(k, b"{}", TTL_S)
        assert [(await bounded.claim(k, TTL_S)).kind for k in quiet] == ["done"] * 3
        assert (await bounded.claim(flood[-1], TTL_S)).kind == "done"
        assert (await bounded.claim(flood[0], TTL_S)).kind == "fresh"  # its own oldest went


async def finished(store: DedupStore, k: str) -> None:
    assert (await store.claim(k, TTL_S)).kind == "fresh"
    await store.finish(k, b"{}", TTL_S)


async def test_an_anonymous_flood_from_fresh_reply_topics_does_not_forget_a_named_call() -> None:
    """Reply topics cost nothing: a flood on a fresh one per request is one bucket, the
    anonymous one, and forgets anonymous calls, never kitchen's booking (each topic
    used to count as a caller of its own, and kitchen's `order-43` then ran again)."""
    async with MemoryStore("w1", max_records=10) as bounded:
        booking = stored("kitchen", None, "order-43")
        await finished(bounded, booking)
        flood = [stored(None, f"reply/{n}", "1") for n in range(20)]
        for k in flood:
            await finished(bounded, k)
        assert (await bounded.claim(booking, TTL_S)).kind == "done"
        assert (await bounded.claim(flood[-1], TTL_S)).kind == "done"
        assert (await bounded.claim(flood[0], TTL_S)).kind == "fresh"  # its own oldest went


async def test_a_named_flood_beside_anonymous_clients_forgets_only_its_own() -> None:
    """Garage floods; kitchen and the anonymous clients (together one bucket) keep theirs.
    Then the anonymous clients flood: they forget their own, not kitchen's nor garage's
    newest."""
    async with MemoryStore("w1", max_records=12) as bounded:
        quiet = [stored("kitchen", None, f"k{n}") for n in range(3)]
        anonymous = [stored(None, f"reply/{n}", "a") for n in range(3)]
        for k in quiet + anonymous:
            await finished(bounded, k)
        flood = [stored("garage", None, f"g{n}") for n in range(500)]
        for k in flood:
            await finished(bounded, k)
        kinds = [(await bounded.claim(k, TTL_S)).kind for k in quiet + anonymous]
        assert kinds == ["done"] * 6
        assert [(await bounded.claim(k, TTL_S)).kind for k in flood[-6:]] == ["done"] * 6
        more = [stored(None, f"reply/more-{n}", "b") for n in range(100)]
        for k in more:
            await finished(bounded, k)
        assert [(await bounded.claim(k, TTL_S)).kind for k in quiet] == ["done"] * 3
        assert (await bounded.claim(more[-1], TTL_S)).kind == "done"
        assert (await bounded.claim(anonymous[0], TTL_S)).kind == "fresh"


# -- a Redis that loses its records -----------------------------------------------------


def counted(reader: InMemoryMetricReader, name: str) -> float:
    return sum(
        point.value for point in metric_points(reader, name) if isinstance(point, NumberDataPoint)
    )


async def test_a_redis_restarted_empty_is_reported_loudly_and_written_back(
    own_redis: RedisServer,
) -> None:
    """Its records are gone: each worker says so in one ERROR line and counts it, and
    writes back what it wrote that still lives, so a repeat of a's call reaching b is a
    repeat again (issue 29.4: 8 of 8 retried calls ran twice)."""
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    prefix = f"t{uuid.uuid4().hex[:8]}"
    with watching("toolbus.dedup", "dedup store emptied", logging.ERROR) as emptied:
        async with (
            open_store(
                own_redis.url, "a", prefix=prefix, on_emptied=metrics.dedup_store_emptied
            ) as a,
            open_store(own_redis.url, "b", prefix=prefix) as b,
        ):
            k = key()
            await a.claim(k, TTL_S)
            await a.finish(k, b"{}", TTL_S)
            assert (await b.claim(k, TTL_S)).kind == "done"
            own_redis.stop()
            own_redis.start()  # on the same port, with nothing
            async with asyncio.timeout(30):  # a heartbeat or two (2 s each), then the line
                while len(emptied.records) < 2:
                    emptied.seen.clear()
                    await emptied.seen.wait()
            assert (await b.claim(k, TTL_S)).kind == "done"  # a wrote it back
    lines = [vars(r) for r in emptied.records if r.levelno == logging.ERROR]
    assert len(lines) == 2  # one per worker, once each
    assert all(line["epoch_was"] != line["epoch_now"] for line in lines)
    assert lines[0]["epoch_now"] == lines[1]["epoch_now"]  # the first to notice made it
    assert counted(reader, "toolbus.dedup.store_emptied") == 1  # a's metrics (b has none)


async def test_calls_after_a_redis_restart_are_not_refused_on_dead_connections(
    own_redis: RedisServer,
) -> None:
    """Each pooled connection a restart cut was found dead only when next used, and
    failed its call (`unavailable`, "the dedup store is unreachable") minutes after Redis
    was back: 32 calls at once right after the restart all failed. A lost connection is
    made again and the command sent once more."""
    prefix = f"t{uuid.uuid4().hex[:8]}"

    async def one(store: DedupStore) -> str:
        k = key()
        if (await store.claim(k, TTL_S)).kind != "fresh":
            return "not fresh"
        await store.finish(k, b"{}", TTL_S)
        return (await store.claim(k, TTL_S)).kind

    async with open_store(own_redis.url, "w1", prefix=prefix) as store:
        assert await asyncio.gather(*(one(store) for _ in range(32))) == ["done"] * 32
        own_redis.stop()
        own_redis.start()  # the same port; every pooled connection is now dead
        assert await asyncio.gather(*(one(store) for _ in range(32))) == ["done"] * 32


async def test_a_command_that_times_out_is_not_sent_again() -> None:
    """Only a lost connection is worth a second send: a command that timed out may have
    run, and sending it again would hold a stalled store's caller three times as long
    (redis-py retries timeouts by default). A listener that speaks just enough RESP to
    let a client connect, and never answers a claim (a script since issue 29), counts the
    claims."""
    sets = 0

    async def stalls_on_set(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sets
        while command := await read_command(reader):
            if command[0].upper() in {b"SET", b"EVALSHA", b"EVAL"}:
                sets += 1  # never answered: the client's socket timeout ends its wait
            elif command[0].upper() == b"HELLO":
                writer.write(b"%1\r\n$5\r\nproto\r\n:3\r\n")
            else:
                writer.write(b"+OK\r\n")
        writer.close()

    server = await asyncio.start_server(stalls_on_set, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        store = RedisStore(f"redis://127.0.0.1:{port}/0", "w1", prefix="t", timeout_s=0.3)
        # Not entered: no heartbeat, no epoch; only the claim's own commands go out.
        async with asyncio.timeout(10):
            with pytest.raises(redis.exceptions.TimeoutError):
                await store.claim(key(), TTL_S)
        assert sets == 1


async def read_command(reader: asyncio.StreamReader) -> list[bytes]:
    """One RESP command (an array of bulk strings); [] at the end of the stream."""
    header = await reader.readline()
    if not header.startswith(b"*"):
        return []
    command = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        command.append((await reader.readexactly(size + 2))[:-2])
    return command


class _FailsWaiting(MemoryStore):
    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = "") -> bytes | None:
        raise ConnectionError("the store went away")


async def test_a_repeat_whose_wait_fails_is_never_told_it_did_not_run() -> None:
    """The store fails while a repeat waits for its running twin: the twin runs on, so
    the answer is `timeout` with `still_running` (the client's "may have run"), not
    `unavailable` with `store`, which says nothing ran (the review of issue 29)."""
    once = Once(_FailsWaiting("w1"), TTL_S, idempotent=lambda tool: False)
    k = key()
    assert (await once.begin(k, "ask", "light", 5.0)).key == k
    twin = await once.begin(k, "ask", "light", 5.0)
    assert twin.error is not None and twin.error.code.value == "timeout"
    assert twin.error.details == {"timeout_s": 5.0, "still_running": True, "store": True}


async def test_a_repeat_waits_on_for_a_copy_that_took_the_id_over() -> None:
    """Three copies of one request: the first's claim is withdrawn (a claim that failed,
    landed late), the third claims the id before the second looks again. The second waits
    for the third's run and gets its reply; it used to answer `timeout` at once (seen
    when Redis resumed under toolbus.Client's re-sends)."""
    store = MemoryStore("w1")
    once = Once(store, TTL_S, idempotent=lambda tool: False)
    k = key()
    first = await once.begin(k, "ask", "light", 5.0)
    second = asyncio.create_task(once.begin(k, "ask", "light", 5.0))
    await asyncio.sleep(0)  # it waits for the first's run
    await once.release(first)  # withdrawn: it never ran
    third = await once.begin(k, "ask", "light", 5.0)  # before the second looks again
    for _ in range(3):
        await asyncio.sleep(0)  # the second looks again meanwhile, and finds the third's run
    assert third.key == k and not second.done()
    reply = Reply(id="r", ok=True, tool="light", duration_ms=1.0)
    await once.finish(third, reply)
    async with asyncio.timeout(5):
        waited = await second
    assert waited.reply == reply.model_dump_json(by_alias=True).encode()


async def test_a_cluster_no_node_of_which_answers_is_unreachable_at_start() -> None:
    """Not redis-py's own exception (no `RedisError`): the worker's clean refusal."""
    url = f"redis+cluster://:hunter2@127.0.0.1:{free_port()}"
    with pytest.raises(StoreUnreachable) as refused:
        async with open_store(url, "w1", prefix="t"):
            pass
    assert "hunter2" not in str(refused.value)
