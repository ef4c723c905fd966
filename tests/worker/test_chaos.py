"""Chaos with real processes and counted outcomes: workers SIGKILLed, the broker SIGKILLed,
a flood. Each request goes through `toolbus.Client`, which re-sends under the same
id when no reply comes; the recording tool writes a line per execution, so "lost" and
"executed twice" are counted, never guessed. Each test prints its counts.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.fleet import Executions, WorkerProcess, flood, recording_env
from tests.support.harness import Broker, RedisServer, measured
from toolbus.client.client import Client, Retry
from toolbus.config import BrokerUrl
from toolbus.wire.contracts import Reply

# Generous against the retries: a worker restart (about 1 s) or a broker restart must
# fit between the first send and the last attempt.
RETRY = Retry(attempts=10, interval_s=2.0)
CALL_TIMEOUT_S = 40.0


class Load:
    """Requests `r0..r{n-1}` to the recording tool, `in_flight` at a time; replies by id."""

    def __init__(self, client: Client, prefix: str) -> None:
        self.client, self.topic = client, f"{prefix}/call/record"
        self.replies: dict[str, Reply] = {}
        self._progress = asyncio.Condition()

    async def run(self, requests: int, in_flight: int, hold_s: float, first: int = 0) -> None:
        """Requests `r{first}` onwards, `requests` of them."""
        slots = asyncio.Semaphore(in_flight)

        async def one(n: int) -> None:
            async with slots:
                body = {"id": f"r{n}", "arguments": {"key": f"r{n}", "hold_s": hold_s}}
                reply = await self.client.request(self.topic, body, timeout_s=CALL_TIMEOUT_S)
                assert isinstance(reply, Reply)  # one call, our envelope: a plain reply
            async with self._progress:
                self.replies[reply.id] = reply
                self._progress.notify_all()

        async with asyncio.TaskGroup() as group:
            for n in range(first, first + requests):
                group.create_task(one(n), name=f"request-r{n}")

    async def reached(self, count: int, timeout_s: float = 30.0) -> set[str]:
        """Once `count` replies are in: the ids answered so far."""
        async with asyncio.timeout(timeout_s), self._progress:
            await self._progress.wait_for(lambda: len(self.replies) >= count)
            return set(self.replies)

    def codes(self) -> Counter[str]:
        return Counter(
            "ok" if r.error is None else r.error.code.value for r in self.replies.values()
        )

    def report(self, scenario: str, requests: int, executions: Executions) -> None:
        """Print the counts; nothing lost, nothing executed twice."""
        lost = requests - len(self.replies)
        twice = [key for key, runs in executions.counts().items() if runs > 1]
        measured(
            f"{scenario}: answered {len(self.replies)}, lost {lost}, executed twice "
            f"{len(twice)}, in_doubt {self.codes()['in_doubt']}, resent {self.client.resent}"
        )
        assert lost == 0
        assert twice == []


def client_for(broker: Broker, prefix: str) -> Client:
    return Client(BrokerUrl.from_url(broker.url), prefix=prefix, retry=RETRY)


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """A broker of the test's own (it gets killed), stopped at the end."""
    started: list[Broker] = []

    def make(**options: object) -> Broker:
        directory = tmp_path / f"broker{len(started)}"
        directory.mkdir()
        started.append(Broker(directory, **options))  # type: ignore[arg-type]
        started[-1].start()
        return started[-1]

    yield make
    for broker in started:
        broker.kill()


async def test_one_of_two_workers_killed_five_times_under_load(
    fresh_broker: Callable[..., Broker], redis_server: RedisServer, tmp_path: Path
) -> None:
    requests, kills, concurrency = 2000, 5, 16
    broker = fresh_broker()
    prefix = f"chaos{uuid.uuid4().hex[:8]}"
    env = recording_env(
        tmp_path,
        prefix,
        concurrency=str(concurrency),
        dedup_store=redis_server.url,
    )
    victim = WorkerProcess(broker.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w1"})
    steady = WorkerProcess(broker.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w2"})
    executions = Executions(tmp_path / "executions")
    await asyncio.gather(victim.start(), steady.start())
    in_flight_at_kills: list[int] = []
    unanswered_at_kills: set[str] = set()
    try:
        async with client_for(broker, prefix) as client:
            load = Load(client, prefix)
            sending = asyncio.create_task(load.run(requests, 64, 0.02), name="load")
            for k in range(kills):
                answered = await load.reached((k + 1) * requests // (kills + 2))
                killed_pid = victim.pid
                await victim.kill()
                # What the killed worker had started and its caller had not heard of.
                in_flight_at_kills.append(len(executions.by(killed_pid) - answered))
                unanswered_at_kills |= {f"r{n}" for n in range(requests)} - answered
                await victim.start()  # the same worker_id: its session and its requests
            async with asyncio.timeout(CALL_TIMEOUT_S + 10):
                await sending
    finally:
        await asyncio.gather(victim.stop(), steady.stop())

    codes = load.codes()
    in_doubt = {i for i, r in load.replies.items() if r.error is not None}
    load.report(
        f"2 workers, one SIGKILLed {kills}x during {requests} requests (retrying requester; "
        f"started and unanswered at the kills: {sum(in_flight_at_kills)})",
        requests,
        executions,
    )
    assert set(codes) <= {"ok", "in_doubt"}, codes
    # In doubt only what a killed worker held: never more than its slots at each kill,
    # and only requests not answered before a kill.
    assert codes["in_doubt"] <= kills * concurrency
    assert in_doubt <= unanswered_at_kills
    counts = executions.counts()
    assert all(counts[i] == 1 for i, r in load.replies.items() if r.error is None)


@pytest.mark.parametrize("persistence", [False, True], ids=["persistence-off", "persistence-on"])
async def test_the_broker_killed_and_restarted_mid_load(
    fresh_broker: Callable[..., Broker],
    redis_server: RedisServer,
    tmp_path: Path,
    persistence: bool,
) -> None:
    requests = 1000
    broker = fresh_broker(persistence=persistence)
    prefix = f"bk{uuid.uuid4().hex[:8]}"
    env = recording_env(
        tmp_path,
        prefix,
        concurrency="16",
        dedup_store=redis_server.url,
        reconnect_max_delay_s="1",
    )
    workers = [
        WorkerProcess(broker.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w{n}"}) for n in (1, 2)
    ]
    executions = Executions(tmp_path / "executions")
    await asyncio.gather(*(w.start() for w in workers))
    try:
        async with client_for(broker, prefix) as client:
            load = Load(client, prefix)
            sending = asyncio.create_task(load.run(requests, 64, 0.02), name="load")
            await load.reached(requests // 3)
            broker.kill()
            broker.start()  # the same port; with persistence, from its last save
            async with asyncio.timeout(CALL_TIMEOUT_S + 10):
                await sending
    finally:
        await asyncio.gather(*(w.stop() for w in workers))

    load.report(
        f"broker SIGKILLed and restarted mid-load ({'persistence on' if persistence else 'off'}),"
        f" {requests} requests",
        requests,
        executions,
    )
    assert load.codes() == {"ok": requests}  # the workers lived: every call ran, once


# The suite's flood: under a minute here. `make bench-flood` runs the 100 000 of issue 10
# through the same code (bench/flood.py).
FLOOD_REQUESTS = int(os.environ.get("TOOLBUS_FLOOD_REQUESTS", "20000"))


async def test_a_flood_waits_in_the_broker_not_in_the_worker(
    fresh_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """Requests published at once: the broker holds the backlog (Receive Maximum =
    concurrency, and a paused socket where the broker overruns it), the worker's memory
    stays flat, and every request is answered."""
    broker = fresh_broker(max_queued_messages=FLOOD_REQUESTS * 2)
    prefix = f"fl{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, worker_id=f"{prefix}-w1", log_level="WARNING")
    worker = WorkerProcess(broker.url, env)
    # Readiness is an INFO line: start at INFO, then the flood runs without per-call logs.
    worker.env = {**env, "TOOLBUS_LOG_LEVEL": "INFO"}
    await worker.start()
    try:
        result = await flood(broker.url, prefix, worker, FLOOD_REQUESTS, timeout_s=120)
    finally:
        await worker.stop()
    measured(result.line())
    assert result.answered == FLOOD_REQUESTS
    assert result.answered_when_published < FLOOD_REQUESTS  # a backlog existed, in the broker
    # Flat: the backlog is the broker's; the dedup store keeps at most 10 000 replies.
    assert result.peak_mib - result.idle_mib < 40
