"""Replies a stalled broker did not take (issue 24.5): the request stays unacknowledged,
its redelivery is answered with the kept reply, and the tool runs once.

`Redeliveries` first, in-process (a handler, a publisher and a connection standing in):
what is acknowledged when, and what a redelivery gets. Then through a real mosquitto,
which a test of its own freezes (SIGSTOP) with calls in flight, for longer than the
worker's keepalive and its `publish_timeout_s`: the worker drops its connections, gives
up the replies, and reconnects once the broker runs again. The callers send each request
once, with a fixed Correlation Data or a reply topic of its own, and never again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from tests.support.harness import Broker, RedisServer, make_settings, measured, running_worker
from tests.support.logwait import LogSeen
from tests.support.mqtt import Caller, call_topic, correlation_of, reply_topic_for
from tests.support.tools import Probe, probe_tools
from toolbus.transport import TransportError
from toolbus.wire.messages import Inbound, Outbound, Unconfirmed
from toolbus.worker.redeliveries import Redeliveries
from toolbus.worker.service import Worker

WAIT_S = 30.0  # generous: two cores shared with other work
SENTINEL = b"sentinel"


# -- in-process ------------------------------------------------------------------------

REQUEST = Inbound(topic="tb/call/echo", payload=b'{"arguments": {"text": "hi"}}', packet_id=7)
REPLY = Outbound(topic="tb/reply/a", payload=b'{"ok": true}')


def delivered(message: Inbound, on: object) -> Inbound:
    """`message` as delivered on connection `on` (a redelivery keeps its Packet Identifier)."""
    return replace(message, delivery=on)


@dataclass
class Connection:
    """Stands in for the request connection: acknowledges what arrived on it while up."""

    up: bool = True
    acked: list[Inbound] = field(default_factory=list)
    acking: asyncio.Event = field(default_factory=asyncio.Event)  # set by each ack

    def ack(self, message: Inbound) -> bool:
        if not self.up or message.delivery is not self:
            return False
        self.acked.append(message)
        self.acking.set()
        return True


@dataclass
class Rig:
    """`Redeliveries` over a handler that answers with what the test scripts."""

    outcomes: list[Unconfirmed | None] = field(default_factory=list)  # one per run
    publishes: list[Unconfirmed | None] = field(default_factory=list)  # one per re-send
    runs: list[Inbound] = field(default_factory=list)
    resent: list[Outbound] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    finish: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.finish.set()
        self.redeliveries = Redeliveries(self.handle, self, bound=4, keep_s=3600)

    async def handle(self, message: Inbound) -> Unconfirmed | None:
        self.runs.append(message)
        self.started.set()
        await self.finish.wait()
        return self.outcomes.pop(0)

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        self.resent.append(out)
        return self.publishes.pop(0) if self.publishes else None

    def connect(self) -> Connection:
        conn = Connection()
        self.redeliveries.connected(conn)
        return conn


async def test_a_reply_taken_late_acknowledges_its_request_then() -> None:
    rig = Rig()
    late: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    rig.outcomes += [Unconfirmed(REPLY, late), None]
    conn = rig.connect()
    await rig.redeliveries.answer(delivered(REQUEST, conn))
    assert conn.acked == []  # given up on: not acknowledged
    late.set_result(None)  # its PUBACK after all
    async with asyncio.timeout(5):
        await conn.acking.wait()
    assert len(conn.acked) == 1
    await rig.redeliveries.answer(delivered(REQUEST, conn))  # forgotten: a new delivery
    assert len(rig.runs) == 2


@pytest.mark.parametrize("sent_late", [True, False])
async def test_a_redelivery_gets_the_kept_reply_and_nothing_runs(sent_late: bool) -> None:
    """The reply went out on a connection lost before its PUBACK (`sent_late`), or never
    went out: the redelivery on the next connection gets it, and is acknowledged."""
    rig = Rig()
    late: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    rig.outcomes.append(Unconfirmed(REPLY, late if sent_late else None))
    first = rig.connect()
    await rig.redeliveries.answer(delivered(REQUEST, first))
    first.up = False
    late.set_exception(TransportError("connection lost before the broker acknowledged"))
    second = rig.connect()
    await rig.redeliveries.answer(delivered(REQUEST, second))
    assert len(rig.runs) == 1
    assert rig.resent == [REPLY]
    assert first.acked == [] and len(second.acked) == 1
    assert rig.redeliveries.replayed == 1


async def test_a_redelivery_of_a_request_still_running_waits_and_is_only_acknowledged() -> None:
    """Answered on the new connection after the old one went (its ack could not go):
    the redelivery, which came meanwhile, adds no reply and runs nothing."""
    rig = Rig()
    rig.finish.clear()
    rig.outcomes.append(None)  # its reply goes out on the new reply connection
    first = rig.connect()
    running = asyncio.create_task(rig.redeliveries.answer(delivered(REQUEST, first)))
    async with asyncio.timeout(5):
        await rig.started.wait()
    first.up = False
    second = rig.connect()
    again = asyncio.create_task(rig.redeliveries.answer(delivered(REQUEST, second)))
    rig.finish.set()
    async with asyncio.timeout(5):
        await asyncio.gather(running, again)
    assert len(rig.runs) == 1
    assert rig.resent == []
    assert len(second.acked) == 1


@pytest.mark.parametrize(
    "other",
    [
        replace(REQUEST, packet_id=8),
        replace(REQUEST, payload=b'{"arguments": {"text": "ho"}}'),
        replace(REQUEST, correlation_data=b"another"),
        replace(REQUEST, response_topic="tb/reply/b"),
    ],
    ids=["packet id", "payload", "correlation data", "response topic"],
)
async def test_another_message_is_not_taken_for_a_redelivery(other: Inbound) -> None:
    rig = Rig()
    rig.outcomes += [Unconfirmed(REPLY), None]
    conn = rig.connect()
    await rig.redeliveries.answer(delivered(REQUEST, conn))
    await rig.redeliveries.answer(delivered(other, conn))
    assert len(rig.runs) == 2
    assert rig.resent == []


async def test_without_a_session_nothing_is_kept_for_a_redelivery() -> None:
    """A clean session: the broker delivers nothing again, and may reuse the Packet
    Identifier for another request."""
    rig = Rig()
    rig.redeliveries = Redeliveries(rig.handle, rig, bound=4, keep_s=0)
    rig.outcomes += [Unconfirmed(REPLY), None]
    await rig.redeliveries.answer(delivered(REQUEST, rig.connect()))
    await rig.redeliveries.answer(delivered(REQUEST, rig.connect()))
    assert len(rig.runs) == 2


@pytest.mark.parametrize("keep_s", [0, 3600], ids=["clean session", "session not resumed"])
async def test_without_a_resumed_session_the_same_bytes_are_a_new_request(keep_s: int) -> None:
    """The broker numbers anew on a session it did not keep (Clean Start, or one expired
    or discarded: a restart without persistence, a takeover with Clean Start), so a
    request with the same Packet Identifier and bytes as one still running from the
    lost connection is another request (a caller sending the same call again), never a
    redelivery: it runs and is answered, not only acknowledged."""
    rig = Rig()
    rig.redeliveries = Redeliveries(rig.handle, rig, bound=4, keep_s=keep_s)
    rig.finish.clear()
    rig.outcomes += [None, None]
    first = rig.connect()
    running = asyncio.create_task(rig.redeliveries.answer(delivered(REQUEST, first)))
    async with asyncio.timeout(5):
        await rig.started.wait()
    first.up = False
    second = Connection()
    rig.redeliveries.connected(second, resumed=False)
    again = asyncio.create_task(rig.redeliveries.answer(delivered(REQUEST, second)))
    rig.finish.set()
    async with asyncio.timeout(5):
        await asyncio.gather(running, again)
    assert len(rig.runs) == 2
    assert len(second.acked) == 1


async def test_at_most_bound_requests_are_kept() -> None:
    """Beyond the bound the oldest is forgotten: its redelivery is handled anew (then the
    dedup store decides), not held in memory for ever."""
    rig = Rig()
    conn = rig.connect()
    requests = [replace(REQUEST, packet_id=n) for n in range(5)]
    rig.outcomes += [Unconfirmed(REPLY)] * 5 + [None]
    for each in requests:
        await rig.redeliveries.answer(delivered(each, conn))
    await rig.redeliveries.answer(delivered(requests[0], conn))  # forgotten: runs
    await rig.redeliveries.answer(delivered(requests[4], conn))  # kept: its reply again
    assert len(rig.runs) == 6
    assert rig.resent == [REPLY]


# -- through a broker -------------------------------------------------------------------


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


@dataclass(frozen=True)
class Sent:
    """One request, sent once: its reply is known by topic and Correlation Data."""

    caller: Caller
    topic: str
    correlation: bytes | None
    body: dict[str, Any]

    @property
    def key(self) -> tuple[str, bytes | None]:
        return (self.topic, self.correlation)


async def send_once(worker: Worker, v5: Caller, v311: Caller) -> list[Sent]:
    """Four from an MQTT v5 client (Correlation Data, one reply topic), two from a 3.1.1
    one (`reply_to`, a reply topic each); in each, half with an id, half with none (a
    generated one, never deduplicated)."""
    shared = reply_topic_for(worker.topics, "v5")
    sent = [
        Sent(v5, shared, f"corr-{n}".encode(), {"id": f"v5-{n}"} if n % 2 else {}) for n in range(4)
    ]
    for n in range(2):
        topic = reply_topic_for(worker.topics, f"v311-{n}")
        sent.append(Sent(v311, topic, None, {"reply_to": topic, **({"id": "v311"} if n else {})}))
    for each in sent:
        await each.caller.subscribe(each.topic)
        await each.caller.publish(
            call_topic(worker.topics, "gate"),
            json.dumps(each.body),
            response_topic=each.topic if each.caller.v5 else None,
            correlation=each.correlation,
        )
    return sent


def gave_up(worker: Worker) -> str:
    """What the worker logs of a reply it gave up on (not of a status it gave up on)."""
    return f"could not publish to {worker.topics.reply_prefixes[0]}"


def key_of(message: aiomqtt.Message) -> tuple[str, bytes | None]:
    return (message.topic.value, correlation_of(message))


async def first_replies(sent: list[Sent]) -> list[aiomqtt.Message]:
    """Each caller's messages until every request it sent has had a reply (the other
    caller's wait in its queue meanwhile)."""
    seen: list[aiomqtt.Message] = []
    async with asyncio.timeout(WAIT_S):
        for caller in {each.caller for each in sent}:
            wanted = {each.key for each in sent if each.caller is caller}
            while not wanted <= {key_of(m) for m in seen}:
                seen.append(await caller.messages.get())
    return seen


async def replies_until_sentinels(sent: list[Sent]) -> list[aiomqtt.Message]:
    """Every message left on the requests' reply topics, up to a sentinel the test
    publishes on each once the worker has drained (the broker has what it sent)."""
    seen: list[aiomqtt.Message] = []
    for caller in {each.caller for each in sent}:
        topics = {each.topic for each in sent if each.caller is caller}
        for topic in topics:
            await caller.publish(topic, SENTINEL)
        async with asyncio.timeout(WAIT_S):
            while topics:
                message = await caller.messages.get()
                if message.payload == SENTINEL:
                    topics.discard(message.topic.value)
                else:
                    seen.append(message)
    return seen


def assert_each_answered_once(sent: list[Sent], seen: list[aiomqtt.Message]) -> None:
    assert Counter(key_of(m) for m in seen) == Counter(each.key for each in sent)
    for message in seen:
        reply = json.loads(message.payload)
        assert reply["ok"], reply
        assert reply["result"]["text"] == "released"
        assert not reply.get("replayed")  # the reply itself, not a repeat's


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
    settings = make_settings(
        own_broker,
        worker_id=f"stall-{store}-{calls_end}",
        client_id_secret="stall-test-secret",  # a persistent session: the broker redelivers
        keepalive_s=1,
        publish_timeout_s=1.0,
        reconnect_max_delay_s=1.0,
        dedup_store=redis_server.url if store == "redis" else "memory",
    )
    async with Caller(own_broker.url) as v5, Caller(own_broker.url, v5=False) as v311:
        async with running_worker(settings, probe_tools(probe)) as worker:
            sent = await send_once(worker, v5, v311)
            await probe.wait_active(len(sent), timeout_s=WAIT_S)
            with (
                counting("toolbus.service", "broker connection lost", 1) as lost,
                counting("toolbus.publisher", gave_up(worker), len(sent)) as given_up,
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
            seen = await first_replies(sent)
        seen += await replies_until_sentinels(sent)
    measured(
        f"stall, calls end {calls_end} ({store} store): "
        f"{len({key_of(m) for m in seen})} of {len(sent)} requests answered, "
        f"{len(seen)} replies, {probe.calls} runs"
    )
    assert_each_answered_once(sent, seen)
    assert probe.calls == len(sent)  # each ran once, with an id or without


async def test_a_stall_within_the_keepalive_answers_once_and_acknowledges_late(
    own_broker: Broker,
) -> None:
    """A stall shorter than the keepalive: the connections stay up, the replies are given
    up unacknowledged but were sent, and reach the callers once the broker runs again.
    Their late PUBACKs acknowledge the requests: the worker's next start under the same
    id gets none of them again. (A guard that withholding the ack adds no reply: the
    worker before acknowledged these at the give-up, with the same outcome.)"""
    probe = Probe()
    settings = make_settings(
        own_broker,
        worker_id="stall-short",
        client_id_secret="stall-test-secret",
        publish_timeout_s=1.0,
    )
    async with Caller(own_broker.url) as v5, Caller(own_broker.url, v5=False) as v311:
        async with running_worker(settings, probe_tools(probe)) as worker:
            sent = await send_once(worker, v5, v311)
            await probe.wait_active(len(sent), timeout_s=WAIT_S)
            with counting("toolbus.publisher", gave_up(worker), len(sent)) as given_up:
                async with stalled(own_broker):
                    probe.release.set()
                    async with asyncio.timeout(WAIT_S):
                        await given_up.seen.wait()
            seen = await first_replies(sent)
        # Subscribed again: what the session still held came before the SUBACK, and is
        # answered before this worker has drained.
        async with running_worker(settings, probe_tools(probe)):
            pass
        seen += await replies_until_sentinels(sent)
    assert_each_answered_once(sent, seen)
    assert probe.calls == len(sent)
