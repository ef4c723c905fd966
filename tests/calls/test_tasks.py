"""Calls run as tasks, in-process: the first reply at once, the final one pushed, tasks/get,
retries, quotas, the per-caller bound, the drain, and dead owners (memory and Redis).

No broker: a `ListPublisher` collects what the pipeline sends. The task records are the
production stores (`open_tasks`): memory, and a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.harness import ListPublisher, RedisServer
from tests.support.tools import Probe, probe_tools
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.calls.quotas import Quotas
from toolbus.config import Settings
from toolbus.dedup import MemoryStore, Once, open_tasks
from toolbus.dedup.redis_tasks import RedisTasks
from toolbus.dedup.tasks import MemoryTasks, TaskRecord, TaskStore
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.wire.messages import Inbound
from toolbus.worker.wiring import build_executor, build_registry, topics_for

REPLY = "tb/reply/r1"


class TaskRig:
    def __init__(self, pipeline: Pipeline, sent: ListPublisher, probe: Probe) -> None:
        self.pipeline, self.sent, self.probe = pipeline, sent, probe

    async def request(self, body: dict[str, Any], *, reply: str = REPLY, **extra: Any) -> None:
        await self.pipeline.handle(
            Inbound(
                topic="tb/call",
                payload=json.dumps(body).encode(),
                response_topic=reply,
                correlation_data=b"c1",
                **extra,
            )
        )

    async def get(self, task_id: str, caller: str | None = None, reply: str = REPLY) -> None:
        body: dict[str, Any] = {"task_id": task_id}
        if caller is not None:
            body["caller"] = caller
        await self.pipeline.handle(
            Inbound(topic="tb/tasks/get", payload=json.dumps(body).encode(), response_topic=reply)
        )

    def taken(self, topic: str = REPLY) -> list[dict[str, Any]]:
        out = [dict(json.loads(m.payload)) for m in self.sent.on(topic)]
        self.sent.sent.clear()
        return out

    async def final(self, topic: str = REPLY, timeout_s: float = 5.0) -> dict[str, Any]:
        """The next message with `ok` on `topic` (pushed when the task ends)."""
        async with asyncio.timeout(timeout_s):
            while True:
                for n, message in enumerate(self.sent.sent):
                    body = dict(json.loads(message.payload))
                    if message.topic == topic and "ok" in body:
                        del self.sent.sent[: n + 1]  # it, and the states before it
                        return body
                await asyncio.sleep(0.01)  # polling what the pipeline publishes, bounded


def task_rig(
    store: TaskStore, *, ttl_s: float = 60.0, tracer: Any = None, **overrides: Any
) -> TaskRig:
    settings = Settings.model_validate({"topic_prefix": "tb", **overrides})
    probe = Probe()
    registry = build_registry([*BUILTIN_TOOLS, *probe_tools(probe)], settings)
    executor = build_executor(settings, registry, **({"tracer": tracer} if tracer else {}))
    sent = ListPublisher()
    pipeline = Pipeline(
        executor,
        topics_for(settings),
        sent,
        worker_id="w1",
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
        once=Once(MemoryStore("w1"), 60.0, executor.idempotent),
        quotas=Quotas(settings.callers),
        task_store=store,
        task_ttl_s=ttl_s,
        **({"tracer": tracer} if tracer else {}),
    )
    return TaskRig(pipeline, sent, probe)


@pytest_asyncio.fixture(params=["memory", "redis", "cluster"])
async def tasks_store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[TaskStore]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    url = {"memory": "memory", "redis": redis_server.url}.get(request.param)
    if url is None:  # a Redis Cluster: the task scripts' keys in one slot
        url = request.getfixturevalue("redis_cluster").url
    yield open_tasks(url, "w1", prefix=prefix)


async def test_first_reply_at_once_then_the_final_reply_and_tasks_get(
    tasks_store: TaskStore,
) -> None:
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        await rig.request({"id": "t1", "tool": "gate", "task": True})
        await rig.probe.wait_active(1)
        (first,) = rig.taken()
        assert first == {
            "type": "task",
            "id": "t1",
            "task_id": first["task_id"],
            "status": "working",
        }
        await rig.get(first["task_id"])
        (state,) = rig.taken()
        assert state["status"] == "working" and "ok" not in state
        rig.probe.release.set()
        final = await rig.final()
        assert final["ok"] is True and final["task_id"] == first["task_id"]
        assert final["status"] == "completed" and final["result"]["text"] == "released"
        await rig.get(first["task_id"])
        (done,) = rig.taken()
        assert done["ok"] is True and done["status"] == "completed"
        assert done["result"]["text"] == "released"


async def test_the_user_property_asks_for_a_task_too(tasks_store: TaskStore) -> None:
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        await rig.request(
            {"id": "t1", "tool": "echo", "arguments": {"text": "hi"}},
            user_properties=(("toolbus-task", "1"),),
        )
        final = await rig.final()
        assert final["status"] == "completed" and final["task_id"]


async def test_a_retried_task_is_the_same_task_and_runs_once(tasks_store: TaskStore) -> None:
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        body = {"id": "same", "tool": "gate", "task": True}
        await rig.request(body)
        await rig.probe.wait_active(1)
        await rig.request(body)
        first, again = rig.taken()
        assert again == first
        rig.probe.release.set()
        final = await rig.final()
        await rig.request(body)  # after its end: the final reply again
        assert (await rig.final())["result"] == final["result"]
        assert rig.probe.calls == 1


async def test_unknown_task_for_another_caller_and_after_its_ttl(tasks_store: TaskStore) -> None:
    rig = task_rig(tasks_store, ttl_s=0.3)
    async with rig.pipeline:
        await rig.request(
            {
                "id": "t1",
                "tool": "echo",
                "arguments": {"text": "x"},
                "caller": "alice",
                "task": True,
            }
        )
        final = await rig.final()
        await rig.get(final["task_id"], caller="mallory")
        (theirs,) = rig.taken()
        assert theirs["ok"] is False and theirs["error"]["code"] == "unknown_task"
        await rig.get(final["task_id"], caller="alice")
        assert rig.taken()[0]["ok"] is True
        async with asyncio.timeout(5):
            while True:  # bounded: until the record's TTL has passed
                await rig.get(final["task_id"], caller="alice")
                (answer,) = rig.taken()
                if not answer["ok"]:
                    break
                await asyncio.sleep(0.05)
        assert answer["error"]["code"] == "unknown_task"


async def test_a_running_task_counts_against_the_in_flight_quota(tasks_store: TaskStore) -> None:
    rig = task_rig(tasks_store, callers={"alice": {"max_in_flight": 1}})
    async with rig.pipeline:
        await rig.request({"id": "t1", "tool": "gate", "caller": "alice", "task": True})
        await rig.probe.wait_active(1)
        rig.taken()
        await rig.request(
            {"id": "t2", "tool": "echo", "arguments": {"text": "x"}, "caller": "alice"}
        )
        (refused,) = rig.taken()
        assert refused["error"]["code"] == "rate_limited"
        assert rig.pipeline.tasks_in_flight() == 1  # what `toolbus status` shows
        rig.probe.release.set()
        assert (await rig.final())["ok"] is True


async def test_a_stopping_worker_ends_its_running_tasks_failed_in_doubt(
    tasks_store: TaskStore,
) -> None:
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        await rig.request({"id": "t1", "tool": "gate", "task": True})
        await rig.probe.wait_active(1)
        (first,) = rig.taken()
        await rig.pipeline.drain_tasks(asyncio.get_running_loop().time())
        final = await rig.final()
        assert final["status"] == "failed" and final["error"]["code"] == "in_doubt"
        assert final["error"]["details"]["in_doubt"] is True
        await rig.get(first["task_id"])
        assert rig.taken()[0]["status"] == "failed"
        assert not rig.sent.on(REPLY)  # the cancelled run pushed nothing more


def record(task_id: str, caller: str, owner: str) -> TaskRecord:
    now = time.time()
    return TaskRecord(
        task_id, task_id, caller, owner, REPLY, None, created_at=now, expires_at=now + 60
    )


async def test_a_callers_flood_of_large_results_does_not_pin_others() -> None:
    tasks = MemoryTasks("w1", caller_max_bytes=64 << 10)
    await tasks.create(record("b1", "bob", tasks.owner))
    for n in range(50):  # 50 results of 16 KiB from one caller, bound 64 KiB
        result = {"id": f"a{n}", "ok": True, "result": {"text": "y" * (16 << 10)}}
        ended = replace(
            record(f"a{n}", "alice", tasks.owner), status="completed", reply=json.dumps(result)
        )
        kept = await tasks.finish(ended)
        assert kept is not None and kept.finished
    assert tasks.held_bytes("alice") <= 64 << 10
    assert await tasks.get("b1") is not None
    assert await tasks.get("a49") is not None  # the newest kept, the oldest gave way
    assert await tasks.get("a0") is None


async def test_a_dead_owners_task_is_failed_in_doubt_by_another_worker(
    redis_server: RedisServer,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    one = RedisTasks(redis_server.url, "w1", prefix=prefix)
    two = RedisTasks(redis_server.url, "w2", prefix=prefix)
    async with two:
        await one.__aenter__()
        rec = record("k1", "alice", one.owner)
        assert await one.create(rec) is None
        assert (await two.get("k1")).status == "working"  # type: ignore[union-attr]
        assert await two.orphans() == []
        await one.__aexit__(None, None, None)  # its heartbeat key gone, as after SIGKILL + TTL
        seen = await two.get("k1")
        assert seen is not None and seen.status == "failed"
        assert json.loads(seen.reply or "{}")["error"]["details"]["in_doubt"] is True
        assert await two.orphans() == []  # marked once: nothing left working


async def test_a_tool_configured_as_a_task_runs_as_one_unasked(tasks_store: TaskStore) -> None:
    rig = task_rig(tasks_store, tools={"echo": {"task": True}})
    async with rig.pipeline:
        await rig.request({"id": "t1", "tool": "echo", "arguments": {"text": "hi"}})
        final = await rig.final()
        assert final["status"] == "completed" and final["task_id"]
        assert rig.pipeline.tasks is not None and rig.pipeline.tasks.in_flight() == 0


async def test_one_trace_from_the_request_to_the_tasks_final_reply() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    rig = task_rig(MemoryTasks("w1"), tracer=provider.get_tracer("test"))
    async with rig.pipeline:
        await rig.request({"id": "t1", "tool": "gate", "task": True})
        await rig.probe.wait_active(1)
        (first,) = rig.taken()
        rig.probe.release.set()
        final = await rig.final()
    [process] = [s for s in spans.get_finished_spans() if s.name.startswith("process ")]
    trace_id = process.context.trace_id
    sends = [s for s in spans.get_finished_spans() if s.name == f"send {REPLY}"]
    assert sends and all(s.context.trace_id == trace_id for s in sends)
    assert final["trace_id"] == format(trace_id, "032x")
    assert first["task_id"] == final["task_id"]


async def test_a_provider_shaped_call_runs_as_a_task_under_toolbus(tasks_store: TaskStore) -> None:
    """One Anthropic `tool_use` block, its options under `toolbus` (a reply in our format:
    a message of many calls answered in a provider's format is one reply, not a task)."""
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        block = {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "hi"}}
        await rig.request({**block, "toolbus": {"task": True, "reply_format": "toolbus"}})
        final = await rig.final()
        assert final["id"] == "toolu_1" and final["status"] == "completed" and final["task_id"]


async def test_a_task_in_a_providers_format_is_refused_not_ignored(
    tasks_store: TaskStore,
) -> None:
    """A provider's message answered in its own format is one reply for all its calls:
    no task. Asked for one, it is refused at once, never run as if it had not asked."""
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        block = {"type": "tool_use", "id": "toolu_2", "name": "gate", "input": {}}
        await rig.request({**block, "toolbus": {"task": True}})
        (refused,) = rig.taken()
        assert refused["ok"] is False and refused["error"]["code"] == "bad_request"
        assert refused["error"]["details"]["reason"] == "task_needs_one_call"
        assert rig.probe.calls == 0


async def test_redis_keeps_a_callers_task_bytes_within_its_bound(redis_server: RedisServer) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    async with RedisTasks(
        redis_server.url, "w1", prefix=prefix, caller_max_bytes=64 << 10
    ) as tasks:
        assert await tasks.create(record("b1", "bob", tasks.owner)) is None
        kept_whole = 0
        for n in range(20):  # 20 results of 16 KiB from one caller, bound 64 KiB
            result = {"id": f"a{n}", "ok": True, "result": {"text": "y" * (16 << 10)}}
            started = record(f"a{n}", "alice", tasks.owner)
            assert await tasks.create(started) is None
            kept = await tasks.finish(
                replace(started, status="completed", reply=json.dumps(result))
            )
            assert kept is not None
            kept_whole += "reply_not_kept" not in (kept.reply or "")
        assert kept_whole < 5  # the bound: the rest kept without their results
        late = await tasks.get("a19")
        assert late is not None and "reply_not_kept" in (late.reply or "")
        assert await tasks.get("b1") is not None  # another caller's record untouched
        assert await tasks.create(record("b2", "bob", tasks.owner)) is None


async def test_a_running_task_cancelled_by_its_caller_ends_cancelled(
    tasks_store: TaskStore,
) -> None:
    """Cancel meets tasks: the cancel names the call's id as for any call; the task's end
    is pushed `cancelled` (started, the tool stopped) and `tasks/get` says so after."""
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        await rig.request({"id": "t9", "tool": "gate", "task": True})
        await rig.probe.wait_active(1)
        (first,) = rig.taken()
        cancel = Inbound(
            topic="tb/cancel", payload=json.dumps({"id": "t9"}).encode(), response_topic=REPLY
        )
        assert await rig.pipeline.cancel(cancel) is True
        final = await rig.final()
        assert final["ok"] is False and final["error"]["code"] == "cancelled"
        assert final["error"]["details"]["started"] is True
        assert (final["status"], final["task_id"]) == ("cancelled", first["task_id"])
        await rig.get(first["task_id"])
        (state,) = rig.taken()
        assert state["status"] == "cancelled" and state["ok"] is False
        assert rig.probe.calls == 1 and rig.probe.active == 0


async def test_a_task_failed_in_doubt_stays_failed_when_its_stalled_owner_finishes(
    redis_server: RedisServer,
) -> None:
    """An answer must stay true: a worker whose heartbeat lapsed (a stalled loop, Redis
    out of reach) is taken for dead and its task failed in doubt by another worker, which
    tells the caller. When the stalled owner's run then ends, its end is neither kept nor
    pushed: the caller gets one final reply, and tasks/get keeps saying failed."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    store = RedisTasks(redis_server.url, "w1", prefix=prefix)
    rig = task_rig(store)
    async with rig.pipeline, RedisTasks(redis_server.url, "w2", prefix=prefix) as other:
        await rig.request({"id": "stall", "tool": "gate", "task": True})
        await rig.probe.wait_active(1)
        (first,) = rig.taken()
        task_id = first["task_id"]
        await store._redis.delete(store._alive("w1"))  # its heartbeat lapsed, as if stalled
        [failed] = await other.orphans()
        assert failed.status == "failed"
        assert await store.update(task_id, "working", "late news") is False
        rig.probe.release.set()
        async with asyncio.timeout(5):
            while rig.pipeline.tasks is not None and rig.pipeline.tasks.in_flight():
                await asyncio.sleep(0.01)  # polled, bounded: the stalled run has ended
        assert [m for m in rig.taken() if "ok" in m] == []  # no second final reply
        kept = await other.get(task_id)
        assert kept is not None and kept.status == "failed"


async def test_an_anonymous_callers_task_is_its_reply_topics(tasks_store: TaskStore) -> None:
    """Without a caller name a task is its reply topic's, as its call's dedup key is: a
    task id is no secret, so another reply topic asking for it hears `unknown_task`."""
    rig = task_rig(tasks_store)
    async with rig.pipeline:
        await rig.request(
            {"id": "anon", "tool": "echo", "arguments": {"text": "mine"}, "task": True}
        )
        final = await rig.final()
        await rig.get(final["task_id"], reply="tb/reply/other")
        (other,) = rig.taken("tb/reply/other")
        assert other["error"]["code"] == "unknown_task"
        await rig.get(final["task_id"])
        (mine,) = rig.taken()
        assert mine["ok"] is True and mine["result"]["structured"]["text"] == "mine"


async def test_a_configured_task_tool_on_a_caller_topic_runs_as_a_task(
    tasks_store: TaskStore,
) -> None:
    """`call/{caller}/{tool}` (claim mode) names its caller before its tool: a tool
    configured `task = true` reached that way is located first, then runs as a task."""
    rig = task_rig(tasks_store, tools={"echo": {"task": True}})
    async with rig.pipeline:
        await rig.pipeline.handle(
            Inbound(
                topic="tb/call/kitchen/echo",
                payload=json.dumps({"id": "k1", "arguments": {"text": "hi"}}).encode(),
                response_topic=REPLY,
                correlation_data=b"c1",
            )
        )
        final = await rig.final()
        assert final["status"] == "completed" and final["task_id"], final
        await rig.get(final["task_id"], caller="kitchen")
        (state,) = rig.taken()
        assert state["ok"] is True
