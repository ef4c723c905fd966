"""The pool's relay over a real redis-server: a message to one worker and its answer;
an owner nobody listens for is gone at once; one that stops listening while asked is
noticed within seconds, never waited for past the bound."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.support.harness import RedisServer
from tests.support.redis_ha import Cluster
from toolbus.dedup.redis_relay import CHECK_S, RedisRelay


def relay(redis_server: RedisServer | Cluster, owner: str, prefix: str) -> RedisRelay:
    return RedisRelay(redis_server.url, prefix=prefix, owner=owner)


@pytest.fixture(params=["redis", "cluster"])
def reached(request: pytest.FixtureRequest) -> RedisServer | Cluster:
    """One Redis, or a Redis Cluster (whose pub/sub reaches a subscriber on any node)."""
    found: RedisServer | Cluster = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    return found


async def test_a_message_reaches_its_owner_and_the_answer_comes_back(
    reached: RedisServer | Cluster,
) -> None:
    redis_server = reached
    prefix = uuid.uuid4().hex
    seen: list[dict[str, Any]] = []

    async def answer(message: dict[str, Any]) -> dict[str, Any]:
        seen.append(message)
        return {"echo": message["n"]}

    holder, asker = relay(redis_server, "w1/a", prefix), relay(redis_server, "w2/b", prefix)
    holder.serve(answer)
    async with holder, asker:
        got = await asker.ask("w1/a", {"n": 7}, 5.0)
    assert got == {"echo": 7} and seen == [{"n": 7}]


async def test_an_owner_nobody_listens_for_is_gone_at_once(reached: RedisServer | Cluster) -> None:
    redis_server = reached
    async with relay(redis_server, "w2/b", uuid.uuid4().hex) as asker:
        started = time.monotonic()
        assert await asker.ask("w1/dead", {"n": 1}, 30.0) is None
    assert time.monotonic() - started < 1.0


async def test_an_owner_answering_slower_than_the_check_is_waited_for(
    reached: RedisServer | Cluster,
) -> None:
    """The asker checks every `CHECK_S` that the owner still listens: on a cluster, at
    the node where the owner's subscription is (another node counts none)."""
    prefix = uuid.uuid4().hex

    async def slow(message: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(CHECK_S * 2.5)  # the tool's own time, not a sync
        return {"echo": message["n"]}

    holder, asker = relay(reached, "w1/a", prefix), relay(reached, "w2/b", prefix)
    holder.serve(slow)
    async with holder, asker:
        assert await asker.ask("w1/a", {"n": 3}, 30.0) == {"echo": 3}


async def test_an_owner_that_stops_listening_mid_wait_is_noticed(
    reached: RedisServer | Cluster,
) -> None:
    redis_server = reached
    prefix = uuid.uuid4().hex
    heard = asyncio.Event()

    async def never(message: dict[str, Any]) -> dict[str, Any]:
        heard.set()
        await asyncio.Event().wait()  # the holder never answers: it will die
        return {}

    holder, asker = relay(redis_server, "w1/a", prefix), relay(redis_server, "w2/b", prefix)
    holder.serve(never)
    async with asker:
        await holder.__aenter__()
        asking = asyncio.create_task(asker.ask("w1/a", {"n": 1}, 60.0))
        async with asyncio.timeout(5):
            await heard.wait()
        started = time.monotonic()
        await holder.__aexit__(None, None, None)  # its connection and subscription go
        async with asyncio.timeout(CHECK_S * 5):
            assert await asking is None
    assert time.monotonic() - started < CHECK_S * 3


async def test_messages_past_the_bound_are_refused_both_ways_and_never_hang(
    redis_server: RedisServer,
) -> None:
    """An ask past `max_message_bytes` is not sent; an answer past it is sent as
    `too_large`; a message past it on the channel (from a peer that is not toolbus) is
    dropped unread and the holder goes on serving."""
    prefix, bound = uuid.uuid4().hex, 4096

    async def answer(message: dict[str, Any]) -> dict[str, Any]:
        return {"echo": "x" * int(message["n"])}

    holder = RedisRelay(redis_server.url, prefix=prefix, owner="w1/a", max_message_bytes=bound)
    asker = RedisRelay(redis_server.url, prefix=prefix, owner="w2/b", max_message_bytes=bound)
    holder.serve(answer)
    async with holder, asker:
        async with asyncio.timeout(5):
            assert await asker.ask("w1/a", {"n": 0, "pad": "y" * bound}, 30.0) == {
                "too_large": True
            }
            assert await asker.ask("w1/a", {"n": bound}, 30.0) == {"too_large": True}
        flood = Redis.from_url(redis_server.url)
        try:
            junk = b"[" * (bound * 4)  # past the bound: never parsed
            assert await flood.publish(f"{prefix}:relay:w1/a", junk) == 1
        finally:
            await flood.aclose()
        async with asyncio.timeout(5):
            assert await asker.ask("w1/a", {"n": 3}, 30.0) == {"echo": "xxx"}
