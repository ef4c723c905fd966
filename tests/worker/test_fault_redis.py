"""The shared store faulted under load, with real processes and counted outcomes: two
`toolbus serve` workers behind `$share`, a retrying `toolbus.Client`, the recording tool
writing a line per execution (so "lost" and "executed twice" are counted, never guessed).

- Redis stopped mid-load and started again (from its append-only file, as production
  runs it): calls during the outage get `unavailable` (or, with `dedup_unavailable =
  "run"`, run unrecorded); the workers recover without a restart.
- Redis with Sentinel: the primary SIGKILLed mid-load and its replica promoted; the
  workers (`redis+sentinel://`) follow the new primary without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer
from tests.support.redis_ha import Sentinels
from tests.worker.test_chaos import CALL_TIMEOUT_S, Load, client_for

REQUESTS, IN_FLIGHT, HOLD_S = 600, 32, 0.02
AFTER = 40  # requests sent once the store is back: every one must run, once
OUTAGE_REPLIES = 40


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[Sentinels]:
    watched = Sentinels(tmp_path / "redis")
    try:
        watched.start()
        yield watched
    finally:
        watched.stop()


async def run_through(
    broker: Broker,
    tmp_path: Path,
    store_url: str,
    fault: Callable[[Load], Awaitable[None]],
    **settings: str,
) -> tuple[Load, Load, Executions, list[WorkerProcess]]:
    """`REQUESTS` calls through two workers with `fault(load)` a third of the way in;
    then `AFTER` more once the load is through. The two loads and the executions."""
    prefix = f"fr{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, concurrency="16", dedup_store=store_url, **settings)
    workers = [
        WorkerProcess(broker.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w{n}"}) for n in (1, 2)
    ]
    await asyncio.gather(*(w.start() for w in workers))
    try:
        async with client_for(broker, prefix) as client:
            load, after = Load(client, prefix), Load(client, prefix)
            sending = asyncio.create_task(load.run(REQUESTS, IN_FLIGHT, HOLD_S), name="load")
            await load.reached(REQUESTS // 3)
            await fault(load)
            async with asyncio.timeout(CALL_TIMEOUT_S + 10):
                await sending
                await after.run(AFTER, IN_FLIGHT, HOLD_S, first=REQUESTS)
    finally:
        await asyncio.gather(*(w.stop() for w in workers))
    return load, after, Executions(tmp_path / "executions"), workers


@pytest.mark.parametrize("policy", ["refuse", "run"])
async def test_redis_stopped_mid_load_and_restarted(
    broker: Broker, tmp_path: Path, policy: str
) -> None:
    store = RedisServer("--appendonly", "yes", "--dir", str(tmp_path))
    store.start()
    during: list[int] = []

    async def outage(load: Load) -> None:
        store.stop()  # SIGTERM: its append-only file keeps every record written
        before = len(load.replies)
        # Down until OUTAGE_REPLIES more replies came meanwhile, or for at most 5 s.
        with contextlib.suppress(TimeoutError):
            await load.reached(before + OUTAGE_REPLIES, timeout_s=5.0)
        during.append(len(load.replies) - before)
        store.start()  # the same port: the workers' clients reconnect by themselves

    try:
        load, after, executions, workers = await run_through(
            broker, tmp_path, store.url, outage, dedup_unavailable=policy
        )
    finally:
        store.stop()
    codes = load.codes()
    load.report(
        f"Redis stopped mid-load and restarted (dedup_unavailable = {policy}), {REQUESTS} "
        f"requests, {during[0]} answered during the outage: {dict(codes)}",
        REQUESTS,
        executions,
    )
    if policy == "refuse":
        assert set(codes) <= {"ok", "unavailable", "in_doubt"}, codes
        assert codes["unavailable"] > 0  # the outage was met, and said
    else:  # run unrecorded: available throughout, each such run said
        assert set(codes) <= {"ok", "in_doubt"}, codes
        assert during[0] >= OUTAGE_REPLIES
    unrecorded = sum(n for w in workers for line, n in w.said.items() if "without dedup" in line)
    assert (unrecorded > 0) == (policy == "run"), unrecorded
    assert after.codes() == {"ok": AFTER}  # recovered without a restart


async def test_sentinel_fails_over_mid_load(
    broker: Broker, tmp_path: Path, sentinels: Sentinels
) -> None:
    async def fail_over(_: Load) -> None:
        await asyncio.to_thread(sentinels.fail_over)

    load, after, executions, _ = await run_through(broker, tmp_path, sentinels.url, fail_over)
    codes = load.codes()
    load.report(
        f"Redis primary SIGKILLed mid-load, Sentinel promoted its replica, {REQUESTS} "
        f"requests: {dict(codes)}",
        REQUESTS,
        executions,
    )
    assert set(codes) <= {"ok", "unavailable", "in_doubt"}, codes
    assert after.codes() == {"ok": AFTER}  # the workers follow the new primary
