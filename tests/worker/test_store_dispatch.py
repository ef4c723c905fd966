"""Store dispatch (`dispatch = "store"`) from the outside: a real mosquitto (and a real
ejabberd, which has no `$share` at all), a real redis-server, two workers that both subscribe to the plain request topics (no `$share`:
each receives every request, as on a broker without shared subscriptions). Each request
is answered once, by the worker that took it first in Redis; the other drops it, with no
reply and no dead letter. A re-send goes to the same worker (dedup replays it); once that
worker is gone, another takes it over."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.ejabberd import PASSWORD, USER, Ejabberd
from tests.support.harness import Broker, RedisServer, make_settings, measured, running_worker
from tests.support.mqtt import Caller
from tests.support.redis_ha import Cluster
from toolbus.backends.local.functions import tool
from toolbus.config import Settings
from toolbus.worker.dispatch import NoSharedSubscriptions
from toolbus.worker.service import Worker

WAIT_S = 20.0
ran: list[str] = []  # each run of `note`, by both workers (one process)


@tool
async def note(text: str) -> str:
    """Writes down that it ran."""
    ran.append(text)
    return text


def settings_for(broker: Broker, redis_server: RedisServer | Cluster, prefix: str) -> Settings:
    return make_settings(
        broker,
        topic_prefix=prefix,
        dedup_store=redis_server.url,
        dispatch="store",
    )


@pytest_asyncio.fixture(params=["redis", "cluster"])
async def pool(broker: Broker, request: pytest.FixtureRequest) -> AsyncIterator[list[Worker]]:
    """Two workers in store dispatch, on one Redis or on a three-node Redis Cluster."""
    redis_server = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    ran.clear()
    prefix = f"sd{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                running_worker(settings_for(broker, redis_server, prefix), [note])
            )
            for _ in range(2)
        ]


class Replies:
    """Every message on one reply topic, by correlation data."""

    def __init__(self) -> None:
        self.by_correlation: dict[bytes, list[dict[str, Any]]] = {}

    def heard(self, correlation: bytes, body: dict[str, Any]) -> None:
        self.by_correlation.setdefault(correlation, []).append(body)


async def send(caller: Caller, pool: list[Worker], body: dict[str, Any], reply: str) -> bytes:
    correlation = uuid.uuid4().hex.encode()
    payload = json.dumps(body).encode()
    await caller.publish(
        pool[0].topics.call, payload, response_topic=reply, correlation=correlation
    )
    return correlation


async def settled(pool: list[Worker], messages: int) -> None:
    """Every worker has taken each of `messages` (answered or dropped)."""
    async with asyncio.timeout(WAIT_S):
        while any(w.in_flight.handled < messages for w in pool):
            await asyncio.sleep(0.02)  # polled, bounded: both workers read every message


def answered(worker: Worker) -> int:
    return int(worker.in_flight.handled - dispatched(worker).dropped)


def dispatched(worker: Worker) -> Any:
    assert worker.dispatch is not None
    return worker.dispatch


async def collect(caller: Caller, reply: str, replies: Replies, count: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while sum(len(v) for v in replies.by_correlation.values()) < count:
            message = await caller.next_message(WAIT_S)
            if message.topic.value == reply:
                correlation = getattr(message.properties, "CorrelationData", b"")
                replies.heard(correlation, json.loads(message.payload))


@pytest.mark.parametrize("calls", [60])
async def test_each_call_is_answered_once_by_one_of_the_workers(
    broker: Broker, pool: list[Worker], calls: int
) -> None:
    reply = f"{pool[0].topics.reply_prefixes[0]}me"
    replies = Replies()
    async with Caller(broker.url) as caller:
        await caller.subscribe(reply)
        sent = [
            await send(
                caller,
                pool,
                {"id": f"n{n}", "tool": "note", "arguments": {"text": f"t{n}"}},
                reply,
            )
            for n in range(calls)
        ]
        await collect(caller, reply, replies, calls)
        await settled(pool, calls)
    assert sorted(replies.by_correlation) == sorted(sent)
    assert all(len(v) == 1 and v[0]["ok"] for v in replies.by_correlation.values())
    assert sorted(ran) == sorted(f"t{n}" for n in range(calls))  # each ran once
    shares = [answered(w) for w in pool]
    assert sum(shares) == calls  # the rest each worker dropped: no reply, no dead letter
    measured(f"store dispatch, {calls} calls over 2 workers: answered {shares}")


async def test_a_resend_goes_to_the_worker_that_took_the_first_and_is_replayed(
    broker: Broker, pool: list[Worker]
) -> None:
    reply = f"{pool[0].topics.reply_prefixes[0]}me"
    body = {"id": "again-1", "tool": "note", "arguments": {"text": "once"}}
    replies = Replies()
    async with Caller(broker.url) as caller:
        await caller.subscribe(reply)
        correlation = uuid.uuid4().hex.encode()
        for _ in range(2):  # the same bytes twice: the caller's retry
            await caller.publish(
                pool[0].topics.call,
                json.dumps(body).encode(),
                response_topic=reply,
                correlation=correlation,
            )
        await collect(caller, reply, replies, 2)
        await settled(pool, 2)
    first, second = replies.by_correlation[correlation]
    assert first["ok"] and second["ok"] and second["replayed"] is True
    assert ran == ["once"]
    assert sorted(answered(w) for w in pool) == [0, 2]  # both on one worker


async def test_a_resend_after_its_worker_is_gone_is_taken_over(
    broker: Broker, redis_server: RedisServer, pool: list[Worker]
) -> None:
    reply = f"{pool[0].topics.reply_prefixes[0]}me"
    body = {"id": "gone-1", "tool": "note", "arguments": {"text": "before"}}
    payload = json.dumps(body).encode()
    correlation = uuid.uuid4().hex.encode()
    replies = Replies()
    async with Caller(broker.url) as caller:
        await caller.subscribe(reply)
        await caller.publish(
            pool[0].topics.call, payload, response_topic=reply, correlation=correlation
        )
        await collect(caller, reply, replies, 1)
        await settled(pool, 1)
        [taker] = [w for w in pool if answered(w) == 1]
        [other] = [w for w in pool if w is not taker]
        await taker.__aexit__(None, None, None)  # stopped: its heartbeat key goes with it
        await caller.publish(
            pool[0].topics.call, payload, response_topic=reply, correlation=correlation
        )
        await collect(caller, reply, replies, 2)
    first, again = replies.by_correlation[correlation]
    assert first["ok"] and again["ok"] and again["replayed"] is True  # dedup: not run twice
    assert ran == ["before"]
    assert dispatched(other).taken_over == 1


def test_store_dispatch_needs_a_shared_store(broker: Broker) -> None:
    with pytest.raises(ValueError, match="dedup_store"):
        make_settings(broker, dispatch="store")


@pytest.fixture
def ejabberd(tmp_path: Path) -> Iterator[Ejabberd]:
    node = Ejabberd(tmp_path / "ejabberd")
    node.start()
    try:
        yield node
    finally:
        node.stop()


def on_ejabberd(broker: Broker, node: Ejabberd, **overrides: Any) -> Settings:
    return make_settings(
        broker,  # (only its defaults: the URL is the ejabberd node's)
        broker_url=node.url,
        broker_username=USER,
        broker_password=PASSWORD,
        **overrides,
    )


async def test_behind_share_a_broker_without_shared_subscriptions_is_refused(
    broker: Broker, ejabberd: Ejabberd
) -> None:
    """ejabberd's CONNACK says Shared Subscription Available 0 (and a `$share/`
    SUBSCRIBE would close the session): a worker that needs `$share` stops at once with
    an error that names the fix, rather than letting every worker run every call."""
    with pytest.raises(NoSharedSubscriptions, match="dispatch"):
        async with asyncio.timeout(WAIT_S), running_worker(on_ejabberd(broker, ejabberd)):
            pass


async def test_store_dispatch_runs_a_pool_on_ejabberd(
    broker: Broker, redis_server: RedisServer, ejabberd: Ejabberd
) -> None:
    ran.clear()
    settings = on_ejabberd(broker, ejabberd, dedup_store=redis_server.url, dispatch="store")
    replies = Replies()
    calls = 20
    async with AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(running_worker(settings, [note])) for _ in range(2)]
        reply = f"{pool[0].topics.reply_prefixes[0]}me"
        caller = await stack.enter_async_context(
            Caller(ejabberd.url, username=USER, password=PASSWORD)
        )
        await caller.subscribe(reply)
        sent = [
            await send(
                caller, pool, {"id": f"e{n}", "tool": "note", "arguments": {"text": f"e{n}"}}, reply
            )
            for n in range(calls)
        ]
        await collect(caller, reply, replies, calls)
        await settled(pool, calls)
    assert sorted(replies.by_correlation) == sorted(sent)
    assert all(len(v) == 1 and v[0]["ok"] for v in replies.by_correlation.values())
    assert sorted(ran) == sorted(f"e{n}" for n in range(calls))
    assert sum(answered(w) for w in pool) == calls


async def timed(broker: Broker, redis_server: RedisServer, mode: str, calls: int) -> float:
    """Seconds for `calls` echo calls, 64 in flight, through two workers in `mode`."""
    settings = make_settings(
        broker,
        topic_prefix=f"sc{uuid.uuid4().hex[:8]}",
        dedup_store=redis_server.url,
        dispatch=mode,
    )
    async with AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(running_worker(settings)) for _ in range(2)]
        caller = await stack.enter_async_context(Caller(broker.url))
        reply = f"{pool[0].topics.reply_prefixes[0]}me"
        gate = asyncio.Semaphore(64)

        async def one(n: int) -> bool:
            async with gate:
                body = {"id": f"{mode}{n}", "tool": "echo", "arguments": {"text": "x"}}
                answer, _ = await caller.call(pool[0].topics.call, body, reply_topic=reply)
                return bool(answer["ok"])

        began = time.perf_counter()
        answered = await asyncio.gather(*(one(n) for n in range(calls)))
        took = time.perf_counter() - began
    assert all(answered)
    return took


async def test_what_store_dispatch_costs_against_share(
    broker: Broker, redis_server: RedisServer
) -> None:
    """Measured, not asserted: the same calls through two workers behind `$share` and
    through two in store dispatch (each worker reads every call and asks Redis)."""
    calls = 300
    shared = await timed(broker, redis_server, "shared", calls)
    store = await timed(broker, redis_server, "store", calls)
    measured(
        f"{calls} calls, 2 workers, 64 in flight: $share {calls / shared:.0f}/s, "
        f"store dispatch {calls / store:.0f}/s (store/share {shared / store:.2f})"
    )


async def test_with_redis_away_one_worker_answers_by_rank(broker: Broker) -> None:
    """Redis stops: no worker can ask who took a message, so each ranks the workers it
    last saw alive by the message's digest and only the first answers (its dedup store is
    down too: `unavailable`); the other drops it. One answer, never two."""
    ran.clear()
    own = RedisServer()
    own.start()
    try:
        settings = settings_for(broker, own, f"sr{uuid.uuid4().hex[:8]}")
        async with AsyncExitStack() as stack:
            pool = [
                await stack.enter_async_context(running_worker(settings, [note])) for _ in range(2)
            ]
            async with asyncio.timeout(WAIT_S):  # each has seen the other's heartbeat
                while any(len(dispatched(w).alive) < 2 for w in pool):
                    await asyncio.sleep(0.05)  # polled, bounded: the next heartbeat
            own.stop()
            reply = f"{pool[0].topics.reply_prefixes[0]}me"
            replies = Replies()
            caller = await stack.enter_async_context(Caller(broker.url))
            await caller.subscribe(reply)
            body = {"id": "away-1", "tool": "note", "arguments": {"text": "x"}}
            correlation = await send(caller, pool, body, reply)
            await collect(caller, reply, replies, 1)
            await settled(pool, 1)
        [answer] = replies.by_correlation[correlation]
        assert answer["error"]["code"] == "unavailable", answer
        assert sorted(answered(w) for w in pool) == [0, 1]
        assert ran == []
    finally:
        own.stop()


async def test_a_311_callers_request_is_answered_once_too(
    broker: Broker, pool: list[Worker]
) -> None:
    """MQTT 3.1.1 has no Response Topic: the reply address is in the body, and the body is
    what every worker's digest reads, so one worker answers it."""
    reply = f"{pool[0].topics.reply_prefixes[0]}old"
    async with Caller(broker.url, v5=False) as caller:
        answer, _ = await caller.call(
            pool[0].topics.call,
            {"tool": "note", "arguments": {"text": "v311"}},
            reply_topic=reply,
            timeout_s=WAIT_S,
        )
        await settled(pool, 1)
    assert answer["ok"] is True
    assert sorted(answered(w) for w in pool) == [0, 1] and ran == ["v311"]
