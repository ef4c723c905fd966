"""An emptied Redis from the outside (issue 29.4): `toolbus serve`, a real broker, a Redis
restarted without its data, and a caller sending its requests again.

Before, the 8 calls sent again after the restart all ran a second time (the loss was
logged, nothing more). Now a live worker writes back what it ran; where the worker that
ran them is gone, the calls sent again are refused `unavailable` (`store: "emptied"`,
not run) until those records would have expired.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer
from tests.support.mqtt import Caller

CALLS = 8


async def send_all(broker: Broker, prefix: str) -> list[dict[str, object]]:
    """kitchen's 8 `record` calls, each under its own id, one after the other."""
    replies = []
    async with Caller(broker.url) as caller:
        for n in range(CALLS):
            body = {"id": f"order-{n}", "caller": "kitchen", "arguments": {"key": f"order-{n}"}}
            reply, _ = await caller.call(
                f"{prefix}/call/record", body, reply_topic=f"{prefix}/reply/kitchen", timeout_s=30
            )
            replies.append(reply)
    return replies


async def test_calls_sent_again_after_redis_restarts_empty_do_not_run_twice(
    broker: Broker, own_redis: RedisServer, tmp_path: Path
) -> None:
    prefix = f"re{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, dedup_store=own_redis.url)
    worker = WorkerProcess(broker.url, env)
    await worker.start()
    try:
        first = await send_all(broker, prefix)
        own_redis.stop()
        own_redis.start()  # the same port, nothing kept
        again = await send_all(broker, prefix)
    finally:
        await worker.stop()
    assert [r["ok"] for r in first] == [True] * CALLS
    runs = Executions(tmp_path / "executions").counts()
    assert [runs[f"order-{n}"] for n in range(CALLS)] == [1] * CALLS  # before: each 2
    assert [r["replayed"] for r in again] == [True] * CALLS
    assert [r["result"] for r in again] == [r["result"] for r in first]


async def test_calls_of_a_worker_gone_with_the_records_are_refused_not_run_again(
    broker: Broker, own_redis: RedisServer, tmp_path: Path
) -> None:
    """The worker that ran them is killed, and Redis restarts empty: nobody knows the 8
    calls ran. Sent again to the other worker, each is refused `unavailable` (`store:
    "emptied"`, with `retry_after_ms`) and runs nowhere."""
    prefix = f"rg{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, dedup_store=own_redis.url)
    ran = WorkerProcess(broker.url, env)
    await ran.start()
    first = await send_all(broker, prefix)
    other = WorkerProcess(broker.url, env)
    await other.start()  # beats beside the first: it knows a worker was at work
    try:
        await ran.kill()
        own_redis.stop()
        own_redis.start()
        again = await send_all(broker, prefix)
    finally:
        await other.stop()
    assert [r["ok"] for r in first] == [True] * CALLS
    runs = Executions(tmp_path / "executions").counts()
    assert [runs[f"order-{n}"] for n in range(CALLS)] == [1] * CALLS  # before: each 2
    errors = [r.get("error") for r in again]
    assert all(isinstance(e, dict) and e["code"] == "unavailable" for e in errors), errors
    assert all(e["details"]["store"] == "emptied" for e in errors if isinstance(e, dict))
