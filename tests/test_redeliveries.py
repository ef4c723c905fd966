"""Replies a stalled broker did not take (issue 24.5): the request stays unacknowledged,
its redelivery is answered with the kept reply, and the tool runs once.

A real mosquitto of the test's own is frozen (SIGSTOP) with calls in flight, for longer
than the worker's keepalive and its `publish_timeout_s`: the worker drops its
connections, gives up the replies, and reconnects once the broker runs again. The
caller sends each request once, with a fixed Correlation Data, and never again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from tests.harness import Broker, RedisServer, make_settings, measured, running_worker
from tests.logwait import LogSeen
from tests.mqtt import Caller, call_topic, correlation_of, reply_topic_for
from tests.tools import Probe, probe_tools

WAIT_S = 30.0  # generous: two cores shared with other work
SENTINEL = b"sentinel"


class Counted(LogSeen):
    """`seen` once `count` records containing `text` have arrived."""

    def __init__(self, text: str, count: int) -> None:
        super().__init__(text)
        self.count = count
        self.matched = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.matched += 1
            if self.matched >= self.count:
                self.seen.set()


@contextmanager
def counting(logger_name: str, text: str, count: int) -> Iterator[Counted]:
    logger = logging.getLogger(logger_name)
    handler = Counted(text, count)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker this test alone freezes."""
    broker = Broker(tmp_path)
    broker.start()
    yield broker
    broker.kill()


def signal_broker(broker: Broker, sig: signal.Signals) -> None:
    assert broker.process is not None
    broker.process.send_signal(sig)


@asynccontextmanager
async def stalled(broker: Broker) -> AsyncIterator[None]:
    """The broker frozen for the block; running again after it, whatever happens."""
    signal_broker(broker, signal.SIGSTOP)
    try:
        yield
    finally:
        signal_broker(broker, signal.SIGCONT)


def requests(count: int) -> list[tuple[bytes, dict[str, Any]]]:
    """Half under an id of their own, half with none (a generated one, never deduplicated)."""
    made = []
    for n in range(count):
        body: dict[str, Any] = {"id": f"req-{n}"} if n % 2 == 0 else {}
        made.append((f"corr-{n}".encode(), body))
    return made


async def replies_until_sentinel(caller: Caller, topic: str) -> list[aiomqtt.Message]:
    """Every message on `topic` up to the sentinel the test published after them."""
    await caller.publish(topic, SENTINEL)
    seen: list[aiomqtt.Message] = []
    async with asyncio.timeout(WAIT_S):
        while (message := await caller.messages.get()).payload != SENTINEL:
            seen.append(message)
    return seen


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("calls_end", ["stalled", "reconnected"])
async def test_calls_in_flight_in_a_stall_answer_a_caller_that_sends_once(
    own_broker: Broker, redis_server: RedisServer, store: str, calls_end: str
) -> None:
    """The connections are lost during the stall, and the broker delivers the requests
    again once the worker is back on its session. `stalled`: the calls end during the
    stall and their replies are given up; the redelivery gets the kept reply. `reconnected`:
    they end after the worker is back, answering on the new connection; the redelivery is
    only acknowledged. Before, a request without an id ran again (2 runs, and in the second
    case 2 replies), and one with an id got a second reply (`replayed`) in the second."""
    probe = Probe()
    count = 6
    settings = make_settings(
        own_broker,
        worker_id=f"stall-{store}-{calls_end}",
        keepalive_s=1,
        publish_timeout_s=1.0,
        reconnect_max_delay_s=1.0,
        dedup_store=redis_server.url if store == "redis" else "memory",
    )
    async with Caller(own_broker.url) as caller:
        async with running_worker(settings, probe_tools(probe)) as worker:
            topic = reply_topic_for(worker.topics)
            await caller.subscribe(topic)
            sent = requests(count)
            for correlation, body in sent:
                await caller.publish(
                    call_topic(worker.topics, "gate"),
                    json.dumps(body),
                    response_topic=topic,
                    correlation=correlation,
                )
            await probe.wait_active(count, timeout_s=WAIT_S)
            with (
                counting("toolbus.service", "broker connection lost", 1) as lost,
                counting("toolbus.publisher", "could not publish to", count) as given_up,
                counting("toolbus.service", "subscribed to", 1) as back,
            ):
                async with stalled(own_broker):
                    async with asyncio.timeout(WAIT_S):
                        await lost.seen.wait()  # the keepalive gave the broker up
                    if calls_end == "stalled":
                        probe.release.set()  # their replies find no connection
                        async with asyncio.timeout(WAIT_S):
                            await given_up.seen.wait()
                async with asyncio.timeout(WAIT_S):
                    await back.seen.wait()  # on its session again: the requests come again
                probe.release.set()
            seen: list[aiomqtt.Message] = []
            async with asyncio.timeout(WAIT_S):  # a reply for each, then the worker drains
                while len({correlation_of(m) for m in seen}) < count:
                    seen.append(await caller.messages.get())
        # The worker has drained: whatever it sent is with the broker, before the sentinel.
        seen += await replies_until_sentinel(caller, topic)
    per_request = Counter(correlation_of(m) for m in seen)
    measured(
        f"stall, calls end {calls_end} ({store} store): {len(per_request)} of {count} "
        f"requests answered, {len(seen)} replies, {probe.calls} runs"
    )
    assert per_request == Counter({correlation: 1 for correlation, _ in sent})
    assert probe.calls == count  # each ran once, with an id or without
    for message in seen:
        reply = json.loads(message.payload)
        assert reply["ok"], reply
        assert reply["result"]["text"] == "released"
        assert "replayed" not in reply or reply["replayed"] is False  # the reply itself
