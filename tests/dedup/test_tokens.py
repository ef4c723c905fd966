"""The token stores, one rule for both: `MemoryTokens` and `RedisTokens` on a real
redis-server; and two workers sharing one Redis, where an approval one worker gave is
taken, once, at the other.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio

from tests.calls.test_pipeline import Rig, rig_for
from tests.support.harness import RedisServer
from tests.support.tools import Probe, probe_tools
from toolbus.dedup.redis import RedisStore
from toolbus.dedup.redis_tokens import RedisTokens
from toolbus.dedup.tokens import (
    ENDED,
    TAKEN,
    MemoryTokens,
    TokenBoundExceeded,
    TokenRecord,
    TokenStore,
    holder_of,
    new_token,
)

BOUND = 64 << 10


def record(holder: str = "ops", *, valid_s: float = 60.0, binding: str = "b1") -> TokenRecord:
    return TokenRecord(
        token=new_token("approval"),
        kind="approval",
        holder=holder,
        owner="w1/x",
        body=json.dumps({"tool": "wipe", "arguments": {"target": "/"}}),
        expires_at=time.time() + valid_s,
        binding=binding,
    )


@pytest_asyncio.fixture(params=["memory", "redis", "cluster"])
async def tokens(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[TokenStore]:
    store: TokenStore
    if request.param == "memory":
        store = MemoryTokens("w1", caller_max_bytes=BOUND)
    else:
        prefix = f"t{uuid.uuid4().hex[:8]}"
        url = redis_server.url
        if request.param == "cluster":  # the Lua scripts' keys in one slot
            url = request.getfixturevalue("redis_cluster").url
        store = RedisTokens(url, "w1", prefix=prefix, caller_max_bytes=BOUND)
    async with store:
        yield store


async def test_a_token_is_taken_once_and_again_only_by_the_request_that_took_it(
    tokens: TokenStore,
) -> None:
    kept = record()
    await tokens.put(kept, 60.0)
    first = await tokens.take(kept.token, "ops", "ops\x1fr1", "b1")
    assert first.record is not None
    assert (first.record.state, first.record.taker) == (TAKEN, "ops\x1fr1")
    again = await tokens.take(kept.token, "ops", "ops\x1fr1", "b1")  # a copy of r1
    assert again.record is not None and again.record.token == kept.token
    assert (await tokens.take(kept.token, "ops", "ops\x1fr2", "b1")).refused == "used"


async def test_refusals_unknown_mismatch_expired(tokens: TokenStore) -> None:
    kept = record()
    await tokens.put(kept, 60.0)
    assert (await tokens.take(kept.token, "eve", "eve\x1fr1", "b1")).refused == "unknown"
    assert (await tokens.take("a.nothing", "ops", "ops\x1fr1", "b1")).refused == "unknown"
    # A mismatch leaves it unused: the call it approves still runs with it.
    assert (await tokens.take(kept.token, "ops", "ops\x1fr1", "b2")).refused == "mismatch"
    assert (await tokens.take(kept.token, "ops", "ops\x1fr1", "b1")).record is not None
    # Expired, it is kept as long again: a late use is told so, not `unknown`.
    late = replace(record(), expires_at=time.time() - 1)
    await tokens.put(late, 60.0)
    assert (await tokens.take(late.token, "ops", "ops\x1fr3", "b1")).refused == "expired"


async def test_a_copy_of_the_request_that_took_it_takes_it_again_past_expiry(
    tokens: TokenStore,
) -> None:
    """A redelivery or retry of the request that used a token, after it expired, must
    reach that request's replay (dedup), not be told `expired`; anyone else is `used`
    before expiry and `expired` after."""
    taken = replace(record(), expires_at=time.time() - 1, state="taken", taker="ops\x1fr1")
    await tokens.put(taken, 60.0)
    again = await tokens.take(taken.token, "ops", "ops\x1fr1", "b1")
    assert again.record is not None and again.record.taker == "ops\x1fr1"
    assert (await tokens.take(taken.token, "ops", "ops\x1fr2", "b1")).refused == "expired"


async def test_an_ended_call_keeps_its_reply_for_the_continuation(tokens: TokenStore) -> None:
    kept = replace(record(binding=""), kind="continuation")
    await tokens.put(kept, 60.0)
    await tokens.end(kept.token, '{"ok":true}')
    taken = await tokens.take(kept.token, "ops", "ops\x1fr1", None)
    assert taken.record is not None
    assert (taken.record.state, taken.record.reply) == (ENDED, '{"ok":true}')
    got = await tokens.get(kept.token)
    assert got is not None and got.state == ENDED
    await tokens.drop(kept.token)
    assert await tokens.get(kept.token) is None


async def test_a_holders_bytes_are_bounded_and_used_tokens_make_room(
    tokens: TokenStore,
) -> None:
    big = replace(record(), body="x" * (BOUND // 4))
    kept = [replace(big, token=new_token("approval")) for _ in range(3)]
    for each in kept:  # three quarters of the bound, and a little more
        await tokens.put(each, 60.0)
    with pytest.raises(TokenBoundExceeded):
        await tokens.put(replace(big, token=new_token("approval")), 60.0)
    await tokens.put(record("someone-else"), 60.0)  # another holder is not refused
    assert (await tokens.take(kept[0].token, "ops", "ops\x1fr1", "b1")).record is not None
    await tokens.put(replace(big, token=new_token("approval")), 60.0)  # the used one gave way


async def test_two_workers_take_one_token_once_between_them(redis_server: RedisServer) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with (
        RedisTokens(redis_server.url, "w1", prefix=prefix) as one,
        RedisTokens(redis_server.url, "w2", prefix=prefix) as two,
    ):
        kept = record()
        await one.put(kept, 60.0)
        taken = await asyncio.gather(
            *(
                store.take(kept.token, "ops", f"ops\x1fr{n}", "b1")
                for n, store in enumerate([one, two] * 4)
            )
        )
    assert sorted(t.refused or "taken" for t in taken) == ["taken"] + ["used"] * 7


def pool_worker(redis: RedisServer, prefix: str, worker_id: str) -> Rig:
    probe = Probe()
    return rig_for(
        probe_tools(probe),
        probe,
        store=RedisStore(redis.url, worker_id, prefix=prefix),
        tokens=RedisTokens(redis.url, worker_id, prefix=prefix),
        callers={"ops": {"approve": ["busy"]}},
    )


async def test_an_approval_given_by_one_worker_runs_once_at_another(
    redis_server: RedisServer,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a, b = pool_worker(redis_server, prefix, "wa"), pool_worker(redis_server, prefix, "wb")
    async with a.pipeline, b.pipeline:
        gated = await a.call("ops/busy", {"id": "p-1", "arguments": {"n": 1}})
        assert gated["error"]["code"] == "approval_required"
        approval = gated["error"]["details"]["approval"]
        approved = {"id": "p-1", "arguments": {"n": 1}, "approval": approval}
        assert (await b.call("ops/busy", approved))["ok"]
        # The same request at the other worker: a repeat, replayed; under another id: used.
        assert (await a.call("ops/busy", approved))["replayed"] is True
        reused = await a.call("ops/busy", {**approved, "id": "p-2"})
        assert reused["error"]["details"]["reason"] == "used"
    assert (a.probe.calls, b.probe.calls) == (0, 1)


async def test_anonymous_clients_share_one_account_however_many_reply_topics(
    tokens: TokenStore,
) -> None:
    """A reply topic is free to make: a flood of anonymous tokens over ever new reply
    topics is refused once the one anonymous account is full; a named caller is not."""
    big = "x" * (BOUND // 4)
    refused = 0
    for n in range(8):  # twice the bound, each under a reply topic of its own
        holder = holder_of(None, f"tb/reply/made-up-{n}")
        try:
            await tokens.put(replace(record(holder), body=big), 60.0)
        except TokenBoundExceeded:
            refused += 1
    assert refused >= 4  # at most the bound's worth was kept, across all the topics
    await tokens.put(replace(record("ops"), body=big), 60.0)  # a named caller's own bound
    with pytest.raises(TokenBoundExceeded):  # one more topic buys no more room
        await tokens.put(replace(record(holder_of(None, "tb/reply/new")), body=big), 60.0)
    # The account is for the bound alone: a token is still usable only from its topic.
    mine = record(holder_of(None, "tb/reply/mine"))
    await tokens.put(mine, 60.0)
    other = holder_of(None, "tb/reply/other")
    assert (await tokens.take(mine.token, other, "x", "b1")).refused == "unknown"
