"""A clean restart loses nothing (issue 29, point 5): a worker with a persistent session
stopped by SIGTERM keeps its subscription when no other worker is online, so the broker
queues what is published meanwhile and the same worker_id answers it on its return; with
another worker online it unsubscribes, so nothing waits for it.

Real processes: mosquitto, `toolbus serve` (one, two, or `--processes 2`) with the
recording tool, and a v5 caller publishing requests (Response Topic, Correlation Data,
QoS 1) while the workers are down. What the broker does with a kept shared subscription
of an offline session, the reason for the rule, is shown on mosquitto itself (what a
stopping worker counts as another online: tests/worker/test_handover.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from collections.abc import Iterable
from pathlib import Path

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, measured
from tests.support.mqtt import Caller, correlation_of
from tests.worker.test_processes_serve import Supervised
from toolbus.config import BrokerUrl

REQUESTS = 5
ANSWER_BOUND_S = 15.0  # requests queued in the session arrive right after the reconnect
STOP_BOUND_S = 30.0


async def publish_requests(caller: Caller, prefix: str, tag: str) -> dict[bytes, str]:
    """REQUESTS calls of the recording tool, each once, at QoS 1 with a Response Topic
    and Correlation Data: correlation -> key."""
    reply_topic = f"{prefix}/reply/{tag}"
    await caller.subscribe(reply_topic)
    sent: dict[bytes, str] = {}
    for n in range(REQUESTS):
        key, correlation = f"{tag}{n}", uuid.uuid4().hex.encode()
        await caller.publish(
            f"{prefix}/call/record",
            json.dumps({"arguments": {"key": key}}),
            response_topic=reply_topic,
            correlation=correlation,
        )
        sent[correlation] = key
    return sent


async def answers(caller: Caller, sent: dict[bytes, str]) -> dict[bytes, dict[str, object]]:
    """The replies to `sent` that come within ANSWER_BOUND_S (all of them: at once)."""
    got: dict[bytes, dict[str, object]] = {}
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(ANSWER_BOUND_S):
            while len(got) < len(sent):
                message = await caller.messages.get()
                correlation = correlation_of(message)
                if correlation in sent:
                    got[correlation] = json.loads(message.payload)
    return got


def answered_ok(got: dict[bytes, dict[str, object]], sent: dict[bytes, str]) -> list[str]:
    return sorted(sent[c] for c, reply in got.items() if reply["ok"])


def two_workers(tmp_path: Path, prefix: str) -> list[dict[str, str]]:
    """The environments of two workers with the recording tool, persistent sessions."""
    env = recording_env(tmp_path, prefix, worker_id=f"{prefix}-w1")
    return [env, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w2"}]


async def started(broker: Broker, envs: Iterable[dict[str, str]]) -> list[WorkerProcess]:
    workers = [WorkerProcess(broker.url, env) for env in envs]
    await asyncio.gather(*(w.start() for w in workers))
    return workers


async def until_online(url: str, prefix: str, *worker_ids: str) -> None:
    """Until each of `worker_ids` has said `online` (retained, or as it comes): the
    others read that status as they stop, a moment after the worker has subscribed."""
    latest: dict[str, str] = {}
    async with Caller(url) as watcher, asyncio.timeout(STOP_BOUND_S):
        await watcher.subscribe(f"{prefix}/status/workers/+")
        while not all(latest.get(worker_id) == "online" for worker_id in worker_ids):
            message = await watcher.next_message()
            if isinstance(message.payload, bytes) and message.payload:
                worker_id = message.topic.value.rsplit("/", 1)[-1]
                latest[worker_id] = json.loads(message.payload)["state"]


async def test_a_lone_worker_restarted_cleanly_answers_what_came_meanwhile(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    prefix = f"clean{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, worker_id=f"{prefix}-w")
    executions = Executions(tmp_path / "executions")
    [first] = await started(broker, [env])
    await first.stop()  # SIGTERM: a clean stop
    assert first.proc is not None and first.proc.returncode == 0
    sent = await publish_requests(caller, prefix, "down")

    [second] = await started(broker, [env])
    try:
        got = await answers(caller, sent)
    finally:
        await second.stop()
    lost = REQUESTS - len(got)
    measured(
        f"requests lost across a clean restart of a lone worker: {lost} of {REQUESTS} "
        f"(answered {len(got)})"
    )
    assert answered_ok(got, sent) == sorted(sent.values()), (lost, first.log[-10:])
    assert executions.counts() == dict.fromkeys(sent.values(), 1)  # each ran once
    assert executions.by(second.pid) == set(sent.values())


async def test_two_workers_stopped_together_lose_nothing(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    """Each sees the other online as it stops; the one that said `stopping` last keeps
    the subscription (both may), so what comes meanwhile waits for their return."""
    prefix = f"clean{uuid.uuid4().hex[:8]}"
    envs = two_workers(tmp_path, prefix)
    workers = await started(broker, envs)
    await asyncio.gather(*(w.stop() for w in workers))
    sent = await publish_requests(caller, prefix, "both")

    workers = await started(broker, envs)
    try:
        got = await answers(caller, sent)
    finally:
        await asyncio.gather(*(w.stop() for w in workers))
    measured(f"requests lost across two workers stopped together: {REQUESTS - len(got)}")
    assert answered_ok(got, sent) == sorted(sent.values())
    assert Executions(tmp_path / "executions").counts() == dict.fromkeys(sent.values(), 1)


async def test_processes_stopped_together_lose_nothing(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    """`toolbus serve --processes 2` stopped by SIGTERM (every child at once), restarted."""
    prefix = f"clean{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, worker_id=f"{prefix}-w")
    async with Supervised(broker.url, env) as supervised:
        await supervised.ready()
        assert supervised.proc is not None
        supervised.proc.send_signal(signal.SIGTERM)
        assert await supervised.exit_code() == 0
    sent = await publish_requests(caller, prefix, "procs")

    async with Supervised(broker.url, env) as again:
        await again.ready()
        got = await answers(caller, sent)
    measured(f"requests lost across `serve --processes 2` stopped: {REQUESTS - len(got)}")
    assert answered_ok(got, sent) == sorted(sent.values())


async def test_a_member_stopped_beside_an_online_one_unsubscribes(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    """One of two stopped: it gives its subscription up, so every call published while
    it is down is answered by the other at once, none held for it."""
    prefix = f"clean{uuid.uuid4().hex[:8]}"
    envs = two_workers(tmp_path, prefix)
    executions = Executions(tmp_path / "executions")
    stopped, steady = await started(broker, envs)
    back = WorkerProcess(broker.url, envs[0])
    try:
        await until_online(broker.url, prefix, f"{prefix}-w2")
        await stopped.stop()
        sent = await publish_requests(caller, prefix, "one")
        got = await answers(caller, sent)
        assert answered_ok(got, sent) == sorted(sent.values())
        assert executions.by(steady.pid) == set(sent.values())

        # The other half of a rolling restart: the first is back (it resumes its
        # session, in which nothing waited), then the second stops beside it.
        await back.start()
        await until_online(broker.url, prefix, f"{prefix}-w1")
        await steady.stop()
        more = await publish_requests(caller, prefix, "roll")
        got = await answers(caller, more)
    finally:
        await asyncio.gather(stopped.stop(), steady.stop(), back.stop())
    assert answered_ok(got, more) == sorted(more.values())
    assert executions.by(back.pid) == set(more.values())
    assert executions.counts() == dict.fromkeys([*sent.values(), *more.values()], 1)


async def test_a_worker_without_a_persistent_session_says_it_keeps_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    prefix = f"clean{uuid.uuid4().hex[:8]}"
    [worker] = await started(broker, [recording_env(tmp_path, prefix)])  # no worker_id
    await worker.stop()
    assert any("without a persistent session" in line for line in worker.log), worker.log


def session(url: str, identifier: str) -> aiomqtt.Client:
    """A v5 client whose session outlives its connection by an hour."""
    broker = BrokerUrl.from_url(url)
    connect = Properties(PacketTypes.CONNECT)
    connect.SessionExpiryInterval = 3600
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=identifier,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=False,
        properties=connect,
    )


async def received(client: aiomqtt.Client, count: int) -> list[bytes]:
    got: list[bytes] = []
    async with asyncio.timeout(ANSWER_BOUND_S):
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            got.append(message.payload)
            if len(got) == count:
                return got
    return got


async def test_mosquitto_queues_to_a_kept_shared_subscription_of_an_offline_session(
    broker: Broker,
) -> None:
    """Why a stopped member unsubscribes while another is online: mosquitto takes the
    group's sessions in turn, offline ones too, and queues their share until they
    return. Ten published while one of two members is away: it gets half on return."""
    group = f"$share/g{uuid.uuid4().hex[:6]}/kept{uuid.uuid4().hex[:6]}/call/#"
    topic = group.split("/", 2)[2].replace("#", "x")
    away_id, online_id = f"away-{uuid.uuid4().hex[:6]}", f"online-{uuid.uuid4().hex[:6]}"
    async with session(broker.url, away_id) as away:
        await away.subscribe(group, qos=1)
    async with session(broker.url, online_id) as online:
        await online.subscribe(group, qos=1)
        async with Caller(broker.url) as publisher:
            for n in range(10):
                await publisher.publish(topic, str(n))
        taken = await received(online, 5)
        async with session(broker.url, away_id) as returned:
            held = await received(returned, 5)
    assert sorted(taken + held) == sorted(str(n).encode() for n in range(10))
