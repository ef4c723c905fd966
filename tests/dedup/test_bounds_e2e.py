"""The dedup store's bytes from the outside (issue 29.1): `toolbus serve`, a real broker,
a real Redis, one caller's large results against another caller.

Before, a record kept its whole reply for `dedup_ttl_s`: 300 results of 1.9 MB took a
worker from 89 to 672 MiB, and one caller filling a Redis capped with `noeviction` made
every other caller's calls `unavailable` for the TTL; with `allkeys-lru` another caller's
finished record was evicted and its repeat ran again.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer, measured
from tests.support.mqtt import Caller

LARGE = 1_900_000  # characters of a large result, as the audit's tool returned
CALL_TIMEOUT_S = 30.0


@pytest.fixture
def capped_redis() -> Iterator[RedisServer]:
    """A Redis of 32 MiB that refuses writes when full (`noeviction`, Redis's default)."""
    server = RedisServer("--maxmemory", "32mb", "--maxmemory-policy", "noeviction")
    server.start()
    yield server
    server.stop()


@pytest_asyncio.fixture
async def caller(broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url) as c:
        yield c


async def report(caller: Caller, prefix: str, who: str, ident: str, size: int) -> dict[str, object]:
    """One `report` call of caller `who` (claim identity) under request id `ident`."""
    body = {"id": ident, "caller": who, "arguments": {"key": f"{who}:{ident}", "size": size}}
    reply, _ = await caller.call(
        f"{prefix}/call/report",
        body,
        reply_topic=f"{prefix}/reply/{who}",
        timeout_s=CALL_TIMEOUT_S,
    )
    return reply


async def test_large_results_do_not_pin_the_workers_memory(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    """40 results of 1.9 MB under one caller's ids, default settings: the worker's RSS
    stays within what one call needs (before: each result kept, 76 MB more); a repeat
    of the first learns that it ran (`reply_not_kept`), and it does not run again."""
    prefix = f"db{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, log_level="WARNING")
    worker = WorkerProcess(broker.url, {**env, "TOOLBUS_LOG_LEVEL": "INFO"})
    await worker.start()
    try:
        await report(caller, prefix, "garage", "warm-up", LARGE)  # the allocator's high water
        before = worker.rss_mib()
        for n in range(40):
            assert (await report(caller, prefix, "garage", f"r{n}", LARGE))["ok"]
        after = worker.rss_mib()
        again = await report(caller, prefix, "garage", "r0", LARGE)
    finally:
        await worker.stop()
    measured(f"worker RSS after 40 results of 1.9 MB: {before:.0f} -> {after:.0f} MiB")
    assert after - before < 30
    assert again["replayed"] is True
    error = again["error"]
    assert isinstance(error, dict) and error["code"] == "reply_not_kept"
    assert error["details"]["ok"] is True and error["details"]["reply_bytes"] > LARGE
    assert Executions(tmp_path / "executions").counts()["garage:r0"] == 1


async def test_one_caller_filling_a_capped_redis_costs_no_other_caller(
    broker: Broker, caller: Caller, capped_redis: RedisServer, tmp_path: Path
) -> None:
    """garage's 20 results of 1.9 MB would be 38 MB in a Redis of 32 MiB: kitchen's calls
    got `unavailable` until garage's records expired. Now records keep at most
    `dedup_max_reply_bytes` of a reply: kitchen is answered, and its repeat replayed."""
    prefix = f"dr{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, log_level="WARNING", dedup_store=capped_redis.url)
    worker = WorkerProcess(broker.url, {**env, "TOOLBUS_LOG_LEVEL": "INFO"})
    await worker.start()
    try:
        floods = [await report(caller, prefix, "garage", f"g{n}", LARGE) for n in range(20)]
        first = await report(caller, prefix, "kitchen", "k1", 100)
        repeat = await report(caller, prefix, "kitchen", "k1", 100)
        garage_again = await report(caller, prefix, "garage", "g0", LARGE)
    finally:
        await worker.stop()
    assert [f["ok"] for f in floods] == [True] * 20
    assert first["ok"], first
    assert repeat["replayed"] is True and repeat["result"] == first["result"]
    error = garage_again["error"]
    assert isinstance(error, dict) and error["code"] == "reply_not_kept"
    runs = Executions(tmp_path / "executions").counts()
    assert (runs["kitchen:k1"], runs["garage:g0"]) == (1, 1)


def test_serve_refuses_a_redis_that_evicts_records(tmp_path: Path, broker: Broker) -> None:
    """An `allkeys-lru` Redis evicted another caller's finished record under one caller's
    flood, and its repeat ran again: `toolbus serve` does not start on it (exit 4, one
    line naming the policy and what to set)."""
    evicting = RedisServer("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    evicting.start()
    try:
        env = recording_env(tmp_path, "ev", dedup_store=evicting.url)
        done = subprocess.run(
            [sys.executable, "-m", "toolbus", "serve", "--broker", broker.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        evicting.stop()
    assert done.returncode == 4, done.stderr
    lines = [line for line in done.stderr.splitlines() if "allkeys-lru" in line]
    assert len(lines) == 1 and "noeviction" in lines[0]
    assert "Traceback" not in done.stderr


async def test_kitchen_is_answered_while_garage_floods_a_capped_redis(
    broker: Broker, capped_redis: RedisServer, tmp_path: Path
) -> None:
    """The same flood from its own connection, kitchen calling meanwhile: none of
    kitchen's calls fails (each answered `ok`, each run once)."""
    prefix = f"dk{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, log_level="WARNING", dedup_store=capped_redis.url)
    worker = WorkerProcess(broker.url, {**env, "TOOLBUS_LOG_LEVEL": "INFO"})
    await worker.start()
    try:
        async with Caller(broker.url) as garage, Caller(broker.url) as kitchen:

            async def flood() -> None:
                for n in range(20):
                    await report(garage, prefix, "garage", f"g{n}", LARGE)

            flooding = asyncio.create_task(flood())
            answers: list[dict[str, object]] = []
            while not flooding.done():
                answers.append(await report(kitchen, prefix, "kitchen", f"k{len(answers)}", 100))
            await flooding
    finally:
        await worker.stop()
    assert answers
    assert all(a["ok"] for a in answers), [a.get("error") for a in answers if not a["ok"]]
