"""Progress in-process: the envelope door's per-call stream, and the pipeline around it.

A `ListPublisher` stands in for the broker: what is published, in which order, and what
the rate limit and the bounds drop (intermediates only; the last update always goes out
before the reply). The same from the outside: tests/worker/test_progress.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import toolbus
from tests.calls.test_pipeline import REPLY, rig_for
from tests.support.harness import ListPublisher
from tests.support.tools import Probe
from toolbus.backends.local.functions import tool
from toolbus.calls.call import ReplyAddress
from toolbus.dedup import MemoryStore
from toolbus.doors.envelope.progress import MAX_MESSAGE_CHARS, ProgressStream
from toolbus.wire.messages import Outbound, Unconfirmed

ADDRESS = ReplyAddress(topic=REPLY, correlation_data=b"c1")


@tool
async def burst(n: int) -> str:
    """Reports 1..n at once (no pause between), as a chatty tool or server does."""
    for step in range(1, n + 1):
        toolbus.progress(step, n)
    return "done"


def values(sent: list[Outbound]) -> list[float]:
    return [json.loads(out.payload)["progress"] for out in sent]


class HeldPublisher(ListPublisher):
    """A broker that does not acknowledge until `release` is set (a slow one)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        await self.release.wait()
        return await super().publish(out)


async def test_the_rate_limit_drops_intermediates_and_keeps_the_last() -> None:
    sent = ListPublisher()
    stream = ProgressStream(sent, ADDRESS, "c1", rate_per_s=10)
    for step in range(1, 101):
        stream(step, 100, None)
    await stream.close()
    assert values(sent.sent) == [1, 100]
    assert (stream.sent, stream.dropped) == (2, 98)
    first = sent.sent[0]
    assert first.topic == REPLY and first.correlation_data == b"c1"
    assert json.loads(first.payload) == {
        "type": "progress",
        "id": "c1",
        "progress": 1.0,
        "total": 100.0,
        "message": None,
    }


async def test_without_a_limit_every_update_goes_out_in_order() -> None:
    sent = ListPublisher()
    stream = ProgressStream(sent, ADDRESS, "c1", rate_per_s=0)
    for step in range(1, 51):
        stream(step, None, f"s{step}")
    await stream.close()
    assert values(sent.sent) == list(range(1, 51))


async def test_a_servers_long_message_is_cut_to_a_status_line() -> None:
    """An MCP server's progress text is untrusted: a megabyte of it queued per update
    would let one server pin memory across many calls."""
    sent = ListPublisher()
    stream = ProgressStream(sent, ADDRESS, "c1", rate_per_s=0)
    stream(1, 2, "x" * 1_000_000)
    await stream.close()
    [out] = sent.sent
    assert len(json.loads(out.payload)["message"]) == MAX_MESSAGE_CHARS


async def test_a_slow_broker_bounds_the_queue_and_the_newest_is_kept() -> None:
    held = HeldPublisher()
    stream = ProgressStream(held, ADDRESS, "c1", rate_per_s=0, bound=8)
    for step in range(1, 201):
        stream(step, 200, None)
    await asyncio.sleep(0)  # the publisher task takes the first and waits on the broker
    held.release.set()
    await stream.close()
    got = values(held.sent)
    assert got == sorted(got) and got[-1] == 200 and len(got) <= 9


async def test_a_broker_that_never_acknowledges_does_not_hold_the_reply() -> None:
    held = HeldPublisher()  # never released
    stream = ProgressStream(held, ADDRESS, "c1", rate_per_s=0, flush_s=0.1)
    stream(1, None, None)
    started = time.monotonic()
    await stream.close()
    assert time.monotonic() - started < 1.0
    stream(2, None, None)  # after the call ended: ignored, never raises


async def test_a_failing_publish_is_not_the_calls_failure() -> None:
    class Failing(ListPublisher):
        async def publish(self, out: Outbound) -> Unconfirmed | None:
            raise RuntimeError("broker gone")

    stream = ProgressStream(Failing(), ADDRESS, "c1", rate_per_s=0)
    stream(1, None, None)
    await stream.close()
    assert (stream.sent, stream.dropped) == (0, 1)


async def test_the_pipeline_sends_progress_before_the_reply_rate_limited() -> None:
    rig = rig_for([burst], Probe())  # default limit: 10 per second
    await rig.request("burst", {"id": "b1", "arguments": {"n": 100}, "progress": True})
    *updates, reply = [json.loads(out.payload) for out in rig.sent.on(REPLY)]
    assert [u["progress"] for u in updates] == [1, 100]
    assert {u["id"] for u in updates} == {"b1"} and reply["ok"]
    events = [
        event
        for span in rig.spans.get_finished_spans()
        for event in span.events
        if event.name == "toolbus.progress"
    ]
    # One event per update the tool reported; its values only, never the message.
    assert len(events) == 100
    assert dict(events[-1].attributes or {}) == {
        "toolbus.progress": 100.0,
        "toolbus.progress.total": 100.0,
    }


async def test_no_progress_unless_asked_and_none_on_a_replay() -> None:
    rig = rig_for([burst], Probe(), store=MemoryStore("w1"), progress_rate_per_s=0)
    await rig.request("burst", {"id": "quiet", "arguments": {"n": 3}})
    assert len(rig.sent.on(REPLY)) == 1
    rig.sent.sent.clear()
    body: dict[str, Any] = {"id": "once", "arguments": {"n": 3}, "progress": True}
    await rig.request("burst", body)
    assert len(rig.sent.on(REPLY)) == 4
    rig.sent.sent.clear()
    await rig.request("burst", body)  # a repeat: the stored reply, and nothing ran
    (replayed,) = [json.loads(out.payload) for out in rig.sent.on(REPLY)]
    assert replayed["replayed"] is True
