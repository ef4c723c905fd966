"""A reply larger than the broker takes (issue 24, where the broker's `max_packet_size`
meets acknowledgement after the reply's PUBACK).

mosquitto disconnects a client that sends a packet over its `max_packet_size` (the
compose broker's: 8 MiB; a many-call reply of MCP results reaches that). The worker's
reply connection then goes with every reply in flight on it; its request, left
unacknowledged, is delivered again once the worker reconnects, and its kept reply sent
again: the broker drops the worker again, without end. The broker says its limit in the
CONNACK (MQTT v5 Maximum Packet Size): a reply over it must be answered with an error
that fits, and cost no connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.calls.test_pipeline import REPLY, rig_for
from tests.support.harness import Broker, ListPublisher, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from tests.support.providers import tool_use
from tests.support.tools import Probe
from toolbus.backends.local.functions import LocalTool, tool
from toolbus.wire.messages import Outbound, TooLarge, Unconfirmed

WAIT_S = 30.0  # generous: two cores shared with other work
BROKER_MAX_PACKET_BYTES = 100_000


@tool
async def big(size: int) -> str:
    """A result of `size` characters."""
    return "x" * size


BIG: list[LocalTool] = [big]


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[Broker]:
    broker = Broker(tmp_path, persistence=False)
    broker.config.write_text(
        broker.config.read_text() + f"max_packet_size {BROKER_MAX_PACKET_BYTES}\n"
    )
    broker.start()
    yield broker
    broker.kill()


async def test_a_reply_over_the_brokers_packet_size_is_refused_without_losing_a_connection(
    small_broker: Broker,
) -> None:
    settings = make_settings(small_broker, worker_id="w-size", publish_timeout_s=3.0)
    with watching("toolbus.service", "broker connection lost") as lost:
        async with running_worker(settings, BIG) as worker, Caller(small_broker.url) as caller:
            topic = reply_topic_for(worker.topics, "big")
            await caller.subscribe(topic)
            await caller.publish(
                call_topic(worker.topics, "big"),
                json.dumps({"id": "big-1", "arguments": {"size": 2 * BROKER_MAX_PACKET_BYTES}}),
                response_topic=topic,
            )
            async with asyncio.timeout(WAIT_S):
                reply = json.loads((await caller.messages.get()).payload)
            assert reply["id"] == "big-1"
            assert reply["ok"] is False
            assert reply["error"]["code"] == "internal"
            # An ordinary call afterwards is answered on the same connections.
            await caller.publish(
                call_topic(worker.topics, "echo"),
                json.dumps({"id": "after", "arguments": {"text": "hi"}}),
                response_topic=topic,
            )
            async with asyncio.timeout(WAIT_S):
                after = json.loads((await caller.messages.get()).payload)
            assert after["id"] == "after"
            assert after["ok"] is True
    assert not lost.seen.is_set()


class SmallBroker(ListPublisher):
    """Refuses to send what the broker would not take, as the transport does."""

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        if len(out.payload) > BROKER_MAX_PACKET_BYTES:
            raise TooLarge(f"{len(out.payload)} bytes")
        return await super().publish(out)


@pytest.mark.parametrize("calls", [1, 3], ids=["one call", "many calls"])
async def test_a_reply_too_large_to_send_answers_internal(calls: int) -> None:
    """In-process, each shape of reply: one call's, and a message of many calls whose
    answers fit one by one but not together."""
    rig = rig_for(BIG, Probe(), publisher=SmallBroker(), max_payload_bytes=16384)
    size = 2 * BROKER_MAX_PACKET_BYTES // calls
    if calls == 1:
        await rig.request("big", {"id": "c", "arguments": {"size": size}})
    else:  # an Anthropic message's tool_use blocks: one reply holds every result
        blocks = [tool_use(f"c{n}", "big", {"size": size}) for n in range(calls)]
        await rig.request(None, json.dumps(blocks).encode())
    [reply] = [json.loads(out.payload) for out in rig.sent.on(REPLY)]
    assert reply["ok"] is False
    assert reply["error"]["code"] == "internal"
