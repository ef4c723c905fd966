"""Which delivery made a provider-only record (issue 30.1, review A and E), in-process.

The broker's DUP flag says it sent a message before, not that a worker read it: a
message in flight when the worker's connection dropped comes back with DUP set although
no worker ever handled it. So a record names the delivery that made it (the worker's
MQTT session and the packet id, which the broker's resend keeps), and only a DUP copy of
that very delivery gets the stored reply. A record whose run was cut short is `in_doubt`
only for its own delivery: another message asking the same is a new question, and runs.
Memory and a real Redis; a run cut short only in Redis (nothing outlives a process in
memory). Through a real broker: test_provider_ids_dup.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.calls.test_pipeline import Rig, anonymous_key, standard_rig
from tests.dedup.test_provider_ids import message, rig, sent_311
from tests.support.harness import RedisServer
from toolbus.dedup import fingerprint
from toolbus.dedup.kept import KeptReplies
from toolbus.dedup.redis import RedisStore

__all__ = ["rig"]  # the memory and Redis rigs of test_provider_ids.py

S1, S2, S3 = "sess:1", "sess:2", "sess:3"  # three deliveries to one session


async def test_turn_2_first_seen_as_dup_runs(rig: Rig) -> None:
    """The review's reproduction: turn 2 asks what turn 1 asked, and its first delivery
    to the worker already carries DUP (sent before, never read). It runs."""
    await sent_311(rig, message("busy", {"n": 1}))
    t2 = await sent_311(rig, message("busy", {"n": 1}), redelivered=True)
    assert t2["replayed"] is False and rig.probe.calls == 2


async def test_a_dup_of_another_delivery_runs_one_of_its_own_replays(rig: Rig) -> None:
    """Turn 1 was delivery 1; turn 2 (delivery 2) first comes with DUP and runs; the
    broker's copy of delivery 2 then gets turn 2's reply, and nothing runs a third time."""
    t1 = await sent_311(rig, message("busy", {"n": 1}), packet_id=1, delivery_id=S1)
    t2 = await sent_311(
        rig, message("busy", {"n": 1}), packet_id=2, delivery_id=S2, redelivered=True
    )
    copy = await sent_311(
        rig, message("busy", {"n": 1}), packet_id=2, delivery_id=S2, redelivered=True
    )
    assert (t1["replayed"], t2["replayed"], copy["replayed"]) == (False, False, True)
    assert rig.probe.calls == 2


async def test_a_dup_of_the_same_delivery_replays_a_new_publish_runs(rig: Rig) -> None:
    """The same packet id without DUP is a new publish (the broker reuses an id once it
    is acknowledged): it runs."""
    await sent_311(rig, message("busy", {"n": 2}), packet_id=7, delivery_id="sess:7")
    copy = await sent_311(
        rig, message("busy", {"n": 2}), packet_id=7, delivery_id="sess:7", redelivered=True
    )
    reused = await sent_311(rig, message("busy", {"n": 2}), packet_id=7, delivery_id="sess:7")
    assert (copy["replayed"], reused["replayed"]) == (True, False)
    assert rig.probe.calls == 2


@pytest_asyncio.fixture
async def cut_short(redis_server: RedisServer) -> AsyncIterator[tuple[Rig, str]]:
    """A rig on Redis where worker `w-dead` stopped mid-run of `call_0` (busy, n=1) that
    came as delivery `S1`: its record is `started` by a worker that is gone."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with RedisStore(redis_server.url, "w-dead", prefix=prefix) as dead:
        asks = fingerprint("busy", {"n": 1, "hold_ms": 5.0})  # normalized: with its default
        claim = await dead.claim(anonymous_key("call_0"), 60.0, fingerprint=asks, delivery=S1)
        assert claim.kind == "fresh"
    built = standard_rig(store=RedisStore(redis_server.url, "w2", prefix=prefix))
    async with built.pipeline:
        yield built, prefix


async def test_a_new_question_over_a_run_cut_short_runs(cut_short: tuple[Rig, str]) -> None:
    """Review E: a message without DUP asking what a run cut short asked is a new
    question (it was `in_doubt` until `dedup_ttl_s`, turn after turn): it runs, and so
    does the turn after it."""
    rig, _ = cut_short
    t2 = await sent_311(rig, message("busy", {"n": 1}), packet_id=2, delivery_id=S2)
    t3 = await sent_311(rig, message("busy", {"n": 1}), packet_id=3, delivery_id=S3)
    assert t2["ok"] and t3["ok"], (t2, t3)
    assert (t2["replayed"], t3["replayed"]) == (False, False)
    assert rig.probe.calls == 2


async def test_a_dup_of_another_delivery_over_a_run_cut_short_runs(
    cut_short: tuple[Rig, str],
) -> None:
    """Review A, cut short: a DUP copy of another delivery is another message: it runs."""
    rig, _ = cut_short
    t2 = await sent_311(
        rig, message("busy", {"n": 1}), packet_id=2, delivery_id=S2, redelivered=True
    )
    assert t2["ok"] and t2["replayed"] is False and rig.probe.calls == 1


async def test_the_copy_of_the_run_cut_short_is_in_doubt(cut_short: tuple[Rig, str]) -> None:
    """The broker's copy of the very delivery cut short may have taken effect: `in_doubt`,
    not run again (as before)."""
    rig, _ = cut_short
    copy = await sent_311(
        rig, message("busy", {"n": 1}), packet_id=1, delivery_id=S1, redelivered=True
    )
    assert copy["error"]["code"] == "in_doubt" and copy["error"]["details"]["worker_id"] == (
        "w-dead"
    )
    assert rig.probe.calls == 0


async def test_the_copy_cut_short_stays_in_doubt_after_a_new_question_ran(
    cut_short: tuple[Rig, str], redis_server: RedisServer
) -> None:
    """The new question runs without taking the key: the broker's copy of the delivery
    cut short, coming only after it (its worker's session resumed late), is still
    `in_doubt`, never a second run of a call that may have taken effect."""
    rig, prefix = cut_short
    t2 = await sent_311(rig, message("busy", {"n": 1}), packet_id=2, delivery_id=S2)
    assert t2["ok"] and rig.probe.calls == 1
    async with RedisStore(redis_server.url, "w3", prefix=prefix) as other:
        seen = await other.claim(anonymous_key("call_0"), 60.0, fingerprint="another")
    assert seen.kind == "orphaned" and seen.delivery == S1  # the orphan, kept
    late = await sent_311(
        rig, message("busy", {"n": 1}), packet_id=1, delivery_id=S1, redelivered=True
    )
    assert late["error"]["code"] == "in_doubt", late
    assert rig.probe.calls == 1


class FinishFails(RedisStore):
    """A Redis store that takes no reply while `down` is set (claims go through)."""

    down = True

    async def finish(self, key: str, reply: bytes, ttl_s: float, **record: Any) -> None:
        if self.down:
            raise RedisConnectionError("the store is away")
        await super().finish(key, reply, ttl_s, **record)


async def test_a_reply_the_worker_keeps_names_its_delivery(redis_server: RedisServer) -> None:
    """A reply the store did not take is kept by the worker (`KeptReplies`) with the
    delivery that asked: the broker's copy of that delivery gets it, a DUP of another
    delivery (a message never read) runs."""
    inner = FinishFails(redis_server.url, "w1", prefix=f"t{uuid.uuid4().hex[:8]}")
    store = KeptReplies(inner, write_timeout_s=1.0, first_retry_s=0.05)
    built = standard_rig(store=store)
    async with built.pipeline:
        t1 = await sent_311(built, message("busy", {"n": 1}), packet_id=1, delivery_id=S1)
        assert store.kept() == 1
        copy = await sent_311(
            built, message("busy", {"n": 1}), packet_id=1, delivery_id=S1, redelivered=True
        )
        t2 = await sent_311(
            built, message("busy", {"n": 1}), packet_id=2, delivery_id=S2, redelivered=True
        )
        inner.down = False  # the kept reply is written, and the worker stops at once
    assert t1["ok"] and copy["replayed"] is True
    assert t2["ok"] and t2["replayed"] is False and built.probe.calls == 2
