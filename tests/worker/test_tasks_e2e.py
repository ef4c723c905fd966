"""Tasks from the outside: `toolbus serve` processes, a real broker, a real Redis.

Two workers share one subscription and one Redis. A task survives its caller going away
(another connection reads it with `tasks/get`), a 3.1.1 caller gets its task's first and
final replies by `reply_to` + `id`, and a task whose worker is SIGKILLed is reported failed
in doubt by the other worker within the bound (its heartbeat's TTL plus one sweep): no
task is left `working` after a worker's death.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer, measured
from tests.support.mqtt import Caller
from toolbus.dedup.redis_fleet import ALIVE_TTL_S, HEARTBEAT_S

# A dead owner is noticed once its heartbeat key has expired, at the next sweep of a live
# worker; a second sweep's slack for a slow machine.
DETECTION_BOUND_S = ALIVE_TTL_S + 2 * HEARTBEAT_S


async def messages_until(caller: Caller, done: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Messages the caller receives (unclaimed by a `call`) until `done(all so far)`."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        while not done(seen):
            message = await caller.messages.get()
            seen.append(json.loads(message.payload))
    return seen


async def ask(
    asker: Caller, prefix: str, task_id: str, reply: str, **fields: Any
) -> dict[str, Any]:
    answer, _ = await asker.call(
        f"{prefix}/tasks/get", {"task_id": task_id, **fields}, reply_topic=reply, timeout_s=10
    )
    return answer


async def test_a_task_survives_its_caller_leaving_and_3_1_1_callers_get_theirs(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"tk{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, dedup_store=redis_server.url, log_level="WARNING")
    workers = [WorkerProcess(broker.url, {**env, "TOOLBUS_LOG_LEVEL": "INFO"}) for _ in range(2)]
    await asyncio.gather(*(w.start() for w in workers))
    reply = f"{prefix}/reply/alice"
    try:
        async with Caller(broker.url) as first:
            started, _ = await first.call(
                f"{prefix}/call/record",
                {
                    "id": "job-1",
                    "caller": "alice",
                    "task": True,
                    "arguments": {"key": "job-1", "hold_s": 1.5},
                },
                reply_topic=reply,
            )
        assert started["status"] == "working" and "ok" not in started  # then it leaves
        async with Caller(broker.url) as later:  # a new connection, after the task ended
            async with asyncio.timeout(20):
                while (
                    state := await ask(later, prefix, started["task_id"], reply, caller="alice")
                )["status"] == "working":
                    await asyncio.sleep(0.2)  # polling tasks/get, bounded above
            assert state["ok"] is True and state["status"] == "completed"
            assert state["result"]["text"] == "job-1" and state["task_id"] == started["task_id"]
            other = await ask(later, prefix, started["task_id"], reply, caller="mallory")
            assert other["error"]["code"] == "unknown_task"
        async with Caller(broker.url, v5=False) as old:  # MQTT 3.1.1: reply_to + id
            await old.subscribe(f"{prefix}/reply/old")
            body = {
                "id": "v3-job",
                "reply_to": f"{prefix}/reply/old",
                "task": True,
                "arguments": {"key": "v3-job"},
            }
            await old.publish(f"{prefix}/call/record", json.dumps(body))
            got = await messages_until(old, lambda seen: any("ok" in m for m in seen), 20)
        assert got[0] == {
            "type": "task",
            "id": "v3-job",
            "task_id": got[0]["task_id"],
            "status": "working",
        }
        assert got[-1]["ok"] is True and got[-1]["task_id"] == got[0]["task_id"]
        assert got[-1]["status"] == "completed"
    finally:
        await asyncio.gather(*(w.stop() for w in workers))
    assert Executions(tmp_path / "executions").counts() == {"job-1": 1, "v3-job": 1}


async def test_a_killed_workers_tasks_are_failed_in_doubt_by_the_other(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"tk{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, dedup_store=redis_server.url, log_level="WARNING")
    workers = [WorkerProcess(broker.url, {**env, "TOOLBUS_LOG_LEVEL": "INFO"}) for _ in range(2)]
    await asyncio.gather(*(w.start() for w in workers))
    executions = Executions(tmp_path / "executions")
    reply = f"{prefix}/reply/alice"
    count = 12
    try:
        async with Caller(broker.url) as caller:
            await caller.subscribe(reply)
            firsts = []
            for n in range(count):
                answer, _ = await caller.call(
                    f"{prefix}/call/record",
                    {
                        "id": f"k{n}",
                        "caller": "alice",
                        "task": True,
                        "arguments": {"key": f"k{n}", "hold_s": 4.0},
                    },
                    reply_topic=reply,
                )
                firsts.append(answer)
            async with asyncio.timeout(20):
                while len(executions.lines()) < count:  # every task has started
                    await asyncio.sleep(0.05)
            victim = workers[0]
            doomed = executions.by(victim.pid)
            assert doomed and len(doomed) < count  # both workers run some
            await victim.kill()
            killed_at = time.monotonic()
            ends = await messages_until(
                caller, lambda seen: sum("ok" in m for m in seen) >= count, 30
            )
            finals = {m["id"]: (m, time.monotonic()) for m in ends if "ok" in m}
            states = [
                await ask(caller, prefix, f["task_id"], reply, caller="alice") for f in firsts
            ]
    finally:
        await asyncio.gather(*(w.stop() for w in workers))
    failed = {i for i, (m, _) in finals.items() if m["status"] == "failed"}
    assert failed == doomed
    for ident in doomed:
        message, _ = finals[ident]
        assert message["error"]["code"] == "in_doubt" and message["error"]["details"]["in_doubt"]
    detected_s = max(at for i, (_, at) in finals.items() if i in doomed) - killed_at
    left_working = sum(state["status"] == "working" for state in states)
    measured(
        f"tasks left working after a worker kill: {left_working} of {count} "
        f"({len(doomed)} on the killed worker); reported failed {detected_s:.1f} s after the "
        f"kill (bound {DETECTION_BOUND_S:.0f} s)"
    )
    assert left_working == 0
    assert detected_s <= DETECTION_BOUND_S
    assert {s["status"] for s in states} == {"completed", "failed"}
