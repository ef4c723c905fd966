"""Cancel messages, in-process: `Pipeline.cancel` over a pipeline with a fake publisher.

What a cancel names (the call's dedup key, by the calls' identity rules), what it does to
a call running here (its tool cancelled, one `cancelled` reply, an event on its span),
to one not come yet (a tombstone: answered `cancelled` unrun, that answer replayed), to
one answered already (nothing) and to another caller's (nothing). The real-process
version, across a pool with Redis, is tests/worker/test_cancel.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from tests.calls.test_pipeline import REPLY, Rig, standard_rig
from tests.support.harness import RedisServer
from toolbus.dedup import Bounds, MemoryStore
from toolbus.dedup.cancels import TOMBSTONE_OVERHEAD_BYTES, Tombstones, tombstone_size
from toolbus.dedup.redis import RedisStore
from toolbus.doors.envelope.cancel import CancelOrder, decode_cancel
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import Topics

NAMED = {"caller": "alice"}


def cancel_message(body: dict[str, Any] | bytes, topic: str = "tb/cancel", **more: Any) -> Inbound:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Inbound(topic=topic, payload=payload, **more)


async def started(rig: Rig, ident: str, **body: Any) -> asyncio.Task[None]:
    """A `gate` call under `ident`, running (its tool entered)."""
    task = asyncio.create_task(rig.request("gate", {"id": ident, "arguments": {}, **body}))
    await rig.probe.wait_active(1)
    return task


async def test_a_running_call_is_cancelled_with_one_reply_and_a_span_event() -> None:
    rig = standard_rig(store=MemoryStore("w1"))
    running = await started(rig, "r1", **NAMED)
    assert await rig.pipeline.cancel(cancel_message({"id": "r1", **NAMED})) is True
    await asyncio.wait_for(running, 5)
    reply = rig.reply()
    assert reply["error"]["code"] == "cancelled"
    assert reply["error"]["details"] == {"started": True, "in_doubt": False, "cause": "caller"}
    [span] = [s for s in rig.spans.get_finished_spans() if s.name == "execute_tool gate"]
    [event] = [e for e in span.events if e.name == "toolbus.cancel"]
    assert dict(event.attributes or {}) == {"cause": "caller", "started": True}
    # The call is answered: a cancel now changes nothing, and its repeat replays.
    assert await rig.pipeline.cancel(cancel_message({"id": "r1", **NAMED})) is False
    await rig.request("gate", {"id": "r1", "arguments": {}, **NAMED})
    again = rig.reply()
    assert again["error"]["details"]["started"] is True and again["replayed"] is True


async def test_an_early_cancel_answers_the_call_unrun_and_its_repeat_replays() -> None:
    rig = standard_rig(store=MemoryStore("w1"))
    assert await rig.pipeline.cancel(cancel_message({"id": "e1", **NAMED})) is False
    await rig.request("gate", {"id": "e1", "arguments": {}, **NAMED})
    first = rig.reply()
    assert first["error"]["code"] == "cancelled"
    assert first["error"]["details"] == {"started": False, "in_doubt": False, "cause": "caller"}
    assert first["replayed"] is False
    await rig.request("gate", {"id": "e1", "arguments": {}, **NAMED})
    assert rig.reply()["replayed"] is True
    assert rig.probe.calls == 0


async def test_a_cancel_for_a_finished_call_leaves_its_reply() -> None:
    rig = standard_rig(store=MemoryStore("w1"))
    await rig.request("echo", {"id": "f1", "arguments": {"text": "hi"}, **NAMED})
    assert rig.reply()["ok"] is True
    await rig.pipeline.cancel(cancel_message({"id": "f1", **NAMED}))
    await rig.request("echo", {"id": "f1", "arguments": {"text": "hi"}, **NAMED})
    again = rig.reply()
    assert again["ok"] is True and again["replayed"] is True


async def test_another_callers_cancel_changes_nothing() -> None:
    rig = standard_rig(store=MemoryStore("w1"))
    running = await started(rig, "o1", **NAMED)
    assert await rig.pipeline.cancel(cancel_message({"id": "o1", "caller": "garage"})) is False
    # Anonymous, under the call's id but another reply topic: someone else too.
    other = cancel_message({"id": "o1"}, response_topic="tb/reply/other")
    assert await rig.pipeline.cancel(other) is False
    rig.probe.release.set()
    await asyncio.wait_for(running, 5)
    assert rig.reply()["ok"] is True


async def test_an_anonymous_caller_names_its_call_by_its_reply_topic() -> None:
    """v5: the Response Topic; 3.1.1: the body's `reply_to` (the call's own)."""
    rig = standard_rig(store=MemoryStore("w1"))
    for n, how in enumerate(({"response_topic": REPLY}, {"reply_to": REPLY})):
        ident = f"a{n}"
        running = await started(rig, ident)
        reply_to = how.get("reply_to")
        body = {"id": ident, **({"reply_to": reply_to} if reply_to else {})}
        message = cancel_message(body, response_topic=how.get("response_topic"))
        assert await rig.pipeline.cancel(message) is True
        await asyncio.wait_for(running, 5)
        assert rig.reply()["error"]["code"] == "cancelled"


@pytest.mark.parametrize(
    ("identity", "topic", "body", "expected"),
    [
        ("claim", "tb/cancel", {"id": "x", "caller": "k"}, "k\x1fx"),
        ("claim", "tb/cancel/k", {"id": "x"}, "k\x1fx"),
        ("claim", "tb/cancel/k", {"id": "x", "caller": "g"}, "caller_mismatch"),
        ("claim", "tb/cancel", {"id": "x"}, "no_owner"),  # no caller, no reply topic
        ("topic", "tb/cancel/k", {"id": "x"}, "k\x1fx"),
        ("topic", "tb/cancel/k", {"id": "x", "caller": "g"}, "caller_mismatch"),
        ("topic", "tb/cancel/anonymous", {"id": "x"}, "reserved_caller"),
        ("topic", "tb/cancel", {"id": "x", "caller": "k"}, "caller_mismatch"),
        ("claim", "tb/cancel/k/more", {"id": "x"}, "bad_topic"),
        ("claim", "tb/cancel", {"id": ""}, "bad_id"),
        ("claim", "tb/cancel", {"id": 7}, "bad_id"),
        ("claim", "tb/cancel", {"id": "x", "caller": 7}, "bad_caller"),
        ("claim", "tb/cancel", b"[1]", "not_an_object"),
        ("claim", "tb/cancel", b"{", "not_json"),
        ("claim", "tb/cancel", b"{" + b" " * 5000 + b"}", "too_large"),
    ],
)
def test_what_a_cancel_names(
    identity: Any, topic: str, body: dict[str, Any] | bytes, expected: str
) -> None:
    topics = Topics("tb", "g", ("tb/reply/",), caller_identity=identity)
    order = decode_cancel(cancel_message(body, topic), topics)
    assert (order.key if isinstance(order, CancelOrder) else order) == expected


def test_a_reply_never_goes_to_a_cancel_topic() -> None:
    topics = Topics("tb", "g", ("tb/",))
    assert topics.reply_problem("tb/cancel/k", "k") == "worker_topic"


def test_tombstones_are_bounded_per_caller_and_in_all() -> None:
    """One caller's flood costs its own oldest tombstones; past the bound of all, a new
    one is not kept (a running call is still cancelled: the running map finds it)."""
    size = tombstone_size("k\x1f0000")
    stones = Tombstones(caller_max_bytes=10 * size, max_bytes=25 * size)
    for n in range(30):
        assert stones.remember(f"k\x1f{n:04}", 60)
    assert not stones.cancelled("k\x1f0000") and stones.cancelled("k\x1f0029")
    assert stones.bytes == 10 * size
    for n in range(10):
        assert stones.remember(f"g\x1f{n:04}", 60)
    assert stones.remember(f"h\x1f{0:04}", 60)
    for n in range(1, 10):
        stones.remember(f"h\x1f{n:04}", 60)
    assert stones.bytes <= 25 * size
    assert not stones.remember("j\x1f0000", 60)  # full: not kept
    assert stones.cancelled("k\x1f0029") and stones.cancelled("g\x1f0009")


def test_a_tombstone_expires() -> None:
    stones = Tombstones(caller_max_bytes=1 << 10, max_bytes=1 << 20)
    stones.remember("k\x1fx", 0.0)
    assert not stones.cancelled("k\x1fx")
    stones.remember("k\x1fy", 60)  # sweeps the expired one
    assert stones.bytes == tombstone_size("k\x1fy")


async def test_redis_tombstones_answer_a_fresh_claim_and_stay_in_their_bound(
    redis_server: RedisServer,
) -> None:
    """In Redis: a fresh claim of a cancelled key says so (inside the claim script);
    a finished record keeps its reply whatever tombstone lies beside it; one caller's
    tombstones hold at most `cancel_caller_max_bytes` (its oldest go first)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    size = TOMBSTONE_OVERHEAD_BYTES + len("k\x1f0000")
    bounds = Bounds(cancel_caller_max_bytes=10 * size)
    async with RedisStore(redis_server.url, "w1", prefix=prefix, bounds=bounds) as store:
        await store.remember_cancel("k\x1fearly", 60)
        assert (await store.claim("k\x1fearly", 60)).cancelled is True
        assert (await store.claim("k\x1fplain", 60)).cancelled is False
        await store.finish("k\x1fplain", b'{"ok": true}', 60)
        await store.remember_cancel("k\x1fplain", 60)
        done = await store.claim("k\x1fplain", 60)
        assert done.kind == "done" and done.reply == b'{"ok": true}'
        for n in range(30):
            await store.remember_cancel(f"g\x1f{n:04}", 60)
        held = await store._redis.zrange(f"{prefix}:dedup-cancels:g", 0, -1)
        assert held == [f"g\x1f{n:04}".encode() for n in range(20, 30)]
        counted = await store._redis.get(f"{prefix}:dedup-cancels:g:bytes")
        assert counted == str(10 * size).encode()


async def test_redis_tombstones_of_all_callers_stay_in_a_window_budget(
    redis_server: RedisServer,
) -> None:
    """In claim mode a caller's name is a claim: a flood may invent a name per cancel, so
    the per-caller bound alone would not bound Redis. All callers' new tombstones share
    `cancel_max_bytes` per window: beyond it a cancel is not remembered (the call, if it
    runs somewhere, is still cancelled there), and Redis holds at most twice that."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    size = TOMBSTONE_OVERHEAD_BYTES + len("c0000\x1fx")
    bounds = Bounds(cancel_max_bytes=50 * size)
    async with RedisStore(redis_server.url, "w1", prefix=prefix, bounds=bounds) as store:
        for n in range(200):
            await store.remember_cancel(f"c{n:04}\x1fx", 60)
        kept = [n for n in range(200) if (await store.claim(f"c{n:04}\x1fx", 60)).cancelled]
    # 50 in one window; up to 50 more only if the loop crossed into the next window.
    assert 50 <= len(kept) <= 100 and kept[:50] == list(range(50))
