"""An MCP tool that runs only as a task (server-everything's `simulate-research-query`,
`execution.taskSupport: "required"`), from the outside: a real broker, a worker, the
TypeScript reference server over stdio.

Called plainly it gets a plain final reply (before: the server's "requires task
augmentation" error); called as a toolbus task, the server's status changes (with their
`statusMessage`) reach the caller as status pushes before the final reply.
"""

from __future__ import annotations

import json
from typing import Any

from tests.acceptance.conftest import everything_server  # noqa: F401 -- the fixture
from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller

CALL_S = 20.0  # the tool runs four 1 s stages


async def test_a_required_task_tool_answers_a_plain_call_and_relays_a_tasks_statuses(
    broker: Broker,
    everything_server: dict[str, Any],  # noqa: F811 -- the fixture
) -> None:
    settings = make_settings(broker, mcpServers={"everything": everything_server})
    prefix = settings.topic_prefix
    async with running_worker(settings) as worker, Caller(broker.url) as caller:
        names = [t["name"] for t in await caller.list_tools(worker.topics)]
        [tool] = [n for n in names if n.endswith("simulate-research-query")]
        reply = f"{prefix}/reply/r"
        plain, _ = await caller.call(
            f"{prefix}/call/{tool}",
            {"id": "p1", "arguments": {"topic": "bees"}},
            reply_topic=reply,
            timeout_s=CALL_S,
        )
        assert plain["ok"] is True, plain
        assert "task_id" not in plain  # the caller did not ask for a task
        await caller.subscribe(f"{prefix}/reply/t")
        body = {"id": "t1", "task": True, "arguments": {"topic": "wasps"}}
        await caller.publish(
            f"{prefix}/call/{tool}",
            json.dumps(body),
            response_topic=f"{prefix}/reply/t",
            correlation=b"t1",
        )
        seen: list[dict[str, Any]] = []
        while not seen or "ok" not in seen[-1]:
            seen.append(json.loads((await caller.next_message(CALL_S)).payload))
    first, *states, final = seen
    assert first["status"] == "working" and "ok" not in first
    assert final["ok"] is True and final["status"] == "completed"
    assert final["task_id"] == first["task_id"]
    messages = [s.get("message") for s in states]
    assert "Gathering sources..." in messages or "Analyzing content..." in messages, seen
    assert len(messages) == len(set(messages))  # each change once (the server sends twice)
