"""Progress from the outside: a real mosquitto, a worker, real MCP servers.

A caller that asks (`"progress": true`) gets its call's updates on its reply topic, with
its correlation data and the call's id, in order and before the one reply with `ok`;
one that does not ask gets none and no `progressToken` goes upstream. Sources: the
MCP project's server-everything (`trigger-long-running-operation`, TypeScript SDK), an
MCPServer of the Python SDK (tests/support/servers/progress_server.py) and a local tool.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import toolbus
from tests.acceptance import conftest as acceptance
from tests.cli.test_cli import cli_env, run_cli
from tests.support.fleet import WorkerProcess
from tests.support.harness import Broker, RedisServer, make_settings, measured, running_worker
from tests.support.mqtt import Caller, call_topic, correlation_of, reply_topic_for
from tests.support.processes import install_plugin
from toolbus.backends.local.functions import tool
from toolbus.worker.service import Worker

PROGRESS_SERVER = {
    "command": sys.executable,
    "args": [str(Path(__file__).parents[1] / "support" / "servers" / "progress_server.py")],
}
WAIT_S = 20.0

everything_server = acceptance.everything_server  # the fixture, here too


@tool
async def chunks(n: int, pause_s: float = 0.0) -> str:
    """Reports n steps of progress through `toolbus.progress`, pausing between them."""
    for step in range(1, n + 1):
        toolbus.progress(step, n, f"chunk {step}")
        if pause_s:
            await asyncio.sleep(pause_s)
    return f"{n} chunks"


@pytest_asyncio.fixture(scope="module")
async def worker(broker: Broker, request: pytest.FixtureRequest) -> AsyncIterator[Worker]:
    everything = request.getfixturevalue("everything_server")  # third-party: TypeScript SDK
    settings = make_settings(
        broker,
        mcpServers={"everything": everything, "progress": PROGRESS_SERVER},
        progress_rate_per_s=0,  # no limit: every update counts here
        tools={"chunks": {"max_timeout_s": 1.0}},
    )
    async with running_worker(settings, [chunks]) as running:
        yield running


async def exchange(
    caller: Caller,
    topic: str,
    body: dict[str, Any],
    reply_topic: str,
    *,
    user_properties: tuple[tuple[str, str], ...] = (),
) -> list[dict[str, Any]]:
    """Every message the request brought to `reply_topic`, up to and with its reply."""
    await caller.subscribe(reply_topic)
    correlation = uuid.uuid4().hex.encode()
    if not caller.v5:
        body = {"reply_to": reply_topic, **body}
    await caller.publish(
        topic,
        json.dumps(body).encode(),
        response_topic=reply_topic if caller.v5 else None,
        correlation=correlation if caller.v5 else None,
        user_properties=user_properties,
    )
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT_S):
        while not got or "ok" not in got[-1]:
            message = await caller.next_message(WAIT_S)
            if caller.v5:
                assert correlation_of(message) == correlation
            got.append(json.loads(message.payload))
    return got


def split(got: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    *updates, reply = got
    assert all(u["type"] == "progress" for u in updates), updates
    return updates, reply


async def test_server_everything_progress_arrives_in_order_before_the_result_none_lost(
    broker: Broker, worker: Worker
) -> None:
    steps = 50
    async with Caller(broker.url) as caller:
        got = await exchange(
            caller,
            call_topic(worker.topics, "trigger-long-running-operation"),
            {"id": "long-1", "arguments": {"duration": 0, "steps": steps}, "progress": True},
            reply_topic_for(worker.topics, "everything"),
        )
    updates, reply = split(got)
    assert reply["ok"], reply
    assert [u["progress"] for u in updates] == list(range(1, steps + 1))
    assert {(u["id"], u["total"]) for u in updates} == {("long-1", steps)}
    measured(f"progress, server-everything, {steps} steps: {len(updates)} arrived, 0 reordered")


async def test_progress_counted_over_many_calls_none_lost_or_reordered(
    broker: Broker, worker: Worker
) -> None:
    """The closing note's figure: lost or reordered updates over a counted run."""
    calls, steps = 20, 50
    lost = reordered = 0
    async with Caller(broker.url) as caller:
        for n in range(calls):
            got = await exchange(
                caller,
                call_topic(worker.topics, "count"),
                {"id": f"count-{n}", "arguments": {"steps": steps}, "progress": True},
                reply_topic_for(worker.topics, f"count{n}"),
            )
            updates, reply = split(got)
            assert reply["ok"] and reply["result"]["structured"]["token"], reply
            values = [u["progress"] for u in updates]
            lost += steps - len(values)
            reordered += values != sorted(values)
    measured(f"progress over {calls} calls x {steps} steps: {lost} lost, {reordered} reordered")
    assert (lost, reordered) == (0, 0)


async def test_no_progress_and_no_token_unless_asked(broker: Broker, worker: Worker) -> None:
    async with Caller(broker.url) as caller:
        got = await exchange(
            caller,
            call_topic(worker.topics, "count"),
            {"id": "quiet", "arguments": {"steps": 5}},
            reply_topic_for(worker.topics, "quiet"),
        )
    assert len(got) == 1 and got[0]["ok"], got
    assert got[0]["result"]["structured"]["token"] is False


async def test_a_v5_user_property_asks_for_progress(broker: Broker, worker: Worker) -> None:
    async with Caller(broker.url) as caller:
        got = await exchange(
            caller,
            call_topic(worker.topics, "count"),
            {"id": "prop", "arguments": {"steps": 3}},
            reply_topic_for(worker.topics, "prop"),
            user_properties=(("toolbus-progress", "1"),),
        )
    updates, reply = split(got)
    assert reply["ok"], reply
    assert [(u["progress"], u["message"]) for u in updates] == [
        (1, "step 1"),
        (2, "step 2"),
        (3, "step 3"),
    ]


async def test_progress_that_does_not_increase_is_dropped(broker: Broker, worker: Worker) -> None:
    async with Caller(broker.url) as caller:
        got = await exchange(
            caller,
            call_topic(worker.topics, "stutter"),
            {"id": "stutter", "arguments": {}, "progress": True},
            reply_topic_for(worker.topics, "stutter"),
        )
    updates, reply = split(got)
    assert reply["ok"], reply
    assert [u["progress"] for u in updates] == [1, 3, 4]


async def test_a_local_tool_reports_progress_to_a_311_caller(
    broker: Broker, worker: Worker
) -> None:
    async with Caller(broker.url, v5=False) as caller:
        got = await exchange(
            caller,
            call_topic(worker.topics, "chunks"),
            {"id": "local-311", "arguments": {"n": 4}, "progress": True},
            reply_topic_for(worker.topics, "local311"),
        )
    updates, reply = split(got)
    assert reply["ok"] and reply["id"] == "local-311", reply
    assert [(u["id"], u["progress"], u["total"]) for u in updates] == [
        ("local-311", float(n), 4.0) for n in range(1, 5)
    ]


async def test_each_call_of_a_provider_message_names_its_own_id(
    broker: Broker, worker: Worker
) -> None:
    body = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "chunks", "input": {"n": 2}},
            {"type": "tool_use", "id": "toolu_b", "name": "count", "input": {"steps": 3}},
        ],
        "toolbus": {"id": "turn-1", "progress": True},
    }
    async with Caller(broker.url) as caller:
        got = await exchange(
            caller, call_topic(worker.topics), body, reply_topic_for(worker.topics, "provider")
        )
    updates, reply = split(got)
    assert reply["ok"], reply
    by_call: dict[str, list[float]] = {}
    for update in updates:
        by_call.setdefault(update["id"], []).append(update["progress"])
    assert by_call == {"toolu_a": [1, 2], "toolu_b": [1, 2, 3]}


async def test_progress_extends_the_deadline_up_to_the_cap(broker: Broker, worker: Worker) -> None:
    """Six steps of 0.1 s each under a 0.25 s timeout: done when progress extends it; cut
    at the tool's `max_timeout_s` (1 s) when the steps take longer than that in all."""
    async with Caller(broker.url) as caller:
        topic = call_topic(worker.topics, "chunks")
        base = {"timeout_s": 0.25, "progress": True}
        plain = await exchange(
            caller,
            topic,
            {"id": "plain", "arguments": {"n": 6, "pause_s": 0.1}, **base},
            reply_topic_for(worker.topics, "plain"),
        )
        extended = await exchange(
            caller,
            topic,
            {
                "id": "ext",
                "arguments": {"n": 6, "pause_s": 0.1},
                "extend_on_progress": True,
                **base,
            },
            reply_topic_for(worker.topics, "ext"),
        )
        capped = await exchange(
            caller,
            topic,
            {
                "id": "cap",
                "arguments": {"n": 20, "pause_s": 0.1},
                "extend_on_progress": True,
                **base,
            },
            reply_topic_for(worker.topics, "cap"),
        )
    assert plain[-1]["error"]["code"] == "timeout", plain[-1]
    assert extended[-1]["ok"], extended[-1]
    assert capped[-1]["error"]["code"] == "timeout", capped[-1]
    # The capped call ran about its cap (1 s): more than its timeout allowed, fewer than 20.
    assert 3 < len(capped) - 1 < 20


STEPPING_TOOL = """
import os

import toolbus

@toolbus.tool
async def stepping(n: int) -> int:
    "Reports 1..n through toolbus.progress; answers this worker's pid."
    for step in range(1, n + 1):
        toolbus.progress(step, n)
    return os.getpid()
"""


async def test_two_workers_on_share_send_each_caller_its_own_progress(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Whichever worker of the pool runs a call, its progress goes to that call's caller."""
    prefix = f"share{uuid.uuid4().hex[:8]}"
    plugin = install_plugin(
        tmp_path / "plugin", "tb_steps", STEPPING_TOOL, {"s": "tb_steps:stepping"}
    )
    env = cli_env(prefix, plugin)
    env.update({"TOOLBUS_DEDUP_STORE": redis_server.url, "TOOLBUS_PROGRESS_RATE_PER_S": "0"})
    workers = [
        WorkerProcess(broker.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w{n}"}) for n in (1, 2)
    ]
    try:
        for worker in workers:
            await worker.start()
        calls, steps, pids = 12, 10, set()
        async with Caller(broker.url) as caller:
            for n in range(calls):
                got = await exchange(
                    caller,
                    f"{prefix}/call/stepping",
                    {"id": f"s{n}", "arguments": {"n": steps}, "progress": True},
                    f"{prefix}/reply/c{n}",
                )
                updates, reply = split(got)
                assert reply["ok"], reply.get("error")
                assert [(u["id"], u["progress"]) for u in updates] == [
                    (f"s{n}", float(step)) for step in range(1, steps + 1)
                ]
                pids.add(reply["result"]["structured"]["result"])
        assert pids == {worker.pid for worker in workers}  # both ran calls
    finally:
        for worker in workers:
            await worker.stop()


async def test_the_rate_limit_drops_intermediates_but_keeps_the_last(
    broker: Broker, request: pytest.FixtureRequest
) -> None:
    """The default limit (10 a second) against 50 updates at once from server-everything."""
    everything = request.getfixturevalue("everything_server")
    settings = make_settings(broker, mcpServers={"everything": everything})
    async with running_worker(settings) as limited, Caller(broker.url) as caller:
        got = await exchange(
            caller,
            call_topic(limited.topics, "trigger-long-running-operation"),
            {"id": "limited", "arguments": {"duration": 0, "steps": 50}, "progress": True},
            reply_topic_for(limited.topics, "limited"),
        )
    updates, reply = split(got)
    assert reply["ok"], reply
    progress = [u["progress"] for u in updates]
    assert progress[0] == 1 and progress[-1] == 50 and len(progress) < 50
    assert progress == sorted(progress)


async def test_the_client_gives_progress_to_its_callback_before_the_reply(
    broker: Broker, worker: Worker
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []
    async with toolbus.Client(broker.url, prefix=worker.topics.prefix) as client:
        reply = await client.call(
            "count",
            {"steps": 20},
            on_progress=lambda u: seen.append((u.progress, u.total, u.message)),
        )
        quiet = await client.call("count", {"steps": 3})  # not asked: no token upstream
    assert reply.result is not None and reply.result.structured == {"token": True, "steps": 20}
    assert seen == [(float(n), 20.0, f"step {n}") for n in range(1, 21)]
    assert quiet.result is not None and quiet.result.structured == {"token": False, "steps": 3}


async def test_toolbus_call_prints_progress_lines_when_piped(
    broker: Broker, worker: Worker
) -> None:
    code, out, err = await run_cli(
        "call",
        "count",
        "steps:=3",
        "--progress",
        "--broker",
        broker.url,
        env=cli_env(worker.topics.prefix),
    )
    assert code == 0, err
    assert json.loads(out)["ok"]
    lines = [line for line in err.splitlines() if line.startswith("progress ")]
    assert lines == ["progress 1/3 step 1", "progress 2/3 step 2", "progress 3/3 step 3"]


async def test_toolbus_call_runs_a_task_with_its_progress(broker: Broker, worker: Worker) -> None:
    """`toolbus call --task`: the call runs as a task on the worker; the command reads past
    its `working` state and prints the final reply, with the task's id and status, and
    the task's progress before it (progress meets tasks)."""
    code, out, err = await run_cli(
        "call",
        "count",
        "steps:=2",
        "--task",
        "--progress",
        "--broker",
        broker.url,
        env=cli_env(worker.topics.prefix),
    )
    assert code == 0, err
    reply = json.loads(out)
    assert reply["ok"] and reply["status"] == "completed" and reply["task_id"]
    lines = [line for line in err.splitlines() if line.startswith("progress ")]
    assert lines == ["progress 1/2 step 1", "progress 2/2 step 2"]
