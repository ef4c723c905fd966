"""Store dispatch's decision in-process, against a real redis-server: which of two
workers answers each copy of a message, as their broker connections come and go.

Every worker reads its own copy of every publish. A worker that took a message and then
lost its broker (`offline`) may be running it: a late copy of that same publish, read by
another worker, stays its own (taking it over would run a call without an id twice);
a re-send (a second copy at the other worker) is taken over, so the caller is answered.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest_asyncio
from redis.asyncio import Redis

from tests.support.harness import RedisServer
from toolbus.dedup.redis_dispatch import RedisDispatch
from toolbus.wire.messages import Inbound

WAIT_S = 10.0


def message(n: int, *, redelivered: bool = False) -> Inbound:
    return Inbound(f"tb/call/t{n}", b'{"arguments": {}}', redelivered=redelivered)


@pytest_asyncio.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[RedisDispatch, RedisDispatch]]:
    prefix = f"d{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:
        one, two = [
            await stack.enter_async_context(
                RedisDispatch(redis_server.url, f"w{n}", prefix=prefix, keep_s=60)
            )
            for n in (1, 2)
        ]
        await one.online()
        await two.online()
        yield one, two


async def gone(redis_server: RedisServer, worker: RedisDispatch) -> None:
    """Until `worker`'s heartbeat is out of Redis (its leave runs on its own task)."""
    prefix = worker._alive_key("")
    async with Redis.from_url(redis_server.url) as redis, asyncio.timeout(WAIT_S):
        while await redis.exists(prefix + worker.owner):
            await asyncio.sleep(0.01)  # polled, bounded: the heartbeat task's next pass


async def test_the_first_to_take_a_message_answers_it_and_keeps_its_re_sends(
    pair: tuple[RedisDispatch, RedisDispatch],
) -> None:
    one, two = pair
    assert await one.mine(message(1)) is True
    assert await two.mine(message(1)) is False  # its copy: another's
    assert await two.mine(message(1)) is False  # a re-send: still the live taker's
    assert await one.mine(message(1)) is True  # the taker's re-send: its own (dedup)
    assert (one.dropped, two.dropped) == (0, 2)


async def test_a_late_copy_of_what_an_offline_worker_took_is_not_taken_over(
    redis_server: RedisServer, pair: tuple[RedisDispatch, RedisDispatch]
) -> None:
    """The taker lost its broker while it may run the call: the other worker's own copy
    of the same publish, read late, is dropped; the caller's re-send is taken over."""
    one, two = pair
    assert await one.mine(message(1)) is True
    one.offline()
    await gone(redis_server, one)
    assert await two.mine(message(1)) is False  # its first copy: the same publish
    assert await two.mine(message(1)) is True  # a second copy here: a re-send
    assert two.taken_over == 1


async def test_a_copy_redelivered_by_the_broker_is_no_re_send(
    redis_server: RedisServer, pair: tuple[RedisDispatch, RedisDispatch]
) -> None:
    one, two = pair
    assert await one.mine(message(1)) is True
    one.offline()
    await gone(redis_server, one)
    assert await two.mine(message(1)) is False
    # The broker delivers the same copy again (DUP: the session reconnected).
    assert await two.mine(message(1, redelivered=True)) is False
    assert two.taken_over == 0


async def test_a_worker_gone_for_good_has_its_messages_taken_over_at_once(
    redis_server: RedisServer, pair: tuple[RedisDispatch, RedisDispatch]
) -> None:
    """A crash leaves no mark, only a heartbeat that lapses (here: removed): the first
    copy the other worker reads is taken over (dedup then says `in_doubt` or reruns)."""
    one, two = pair
    assert await one.mine(message(1)) is True
    async with Redis.from_url(redis_server.url) as redis:
        await redis.delete(one._alive_key(one.owner))
    assert await two.mine(message(1)) is True
    assert two.taken_over == 1


async def test_an_offline_worker_takes_nothing_and_is_back_once_online(
    redis_server: RedisServer, pair: tuple[RedisDispatch, RedisDispatch]
) -> None:
    one, two = pair
    one.offline()
    await gone(redis_server, one)
    assert await one.mine(message(2)) is False  # read from a connection since lost
    assert await two.mine(message(2)) is True  # so the other one takes it
    await one.online()
    assert await one.mine(message(3)) is True
    assert await two.mine(message(3)) is False  # alive again: its messages its own
