"""An MCP tool that runs only as a task (server-everything's `simulate-research-query`,
`execution.taskSupport: "required"`), from the outside: a real broker, a worker, the
TypeScript reference server over stdio.

Called plainly it gets a plain final reply (before: the server's "requires task
augmentation" error); called as a toolbus task, the server's status changes (with their
`statusMessage`) reach the caller as status pushes before the final reply.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

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


CLAIMER = Path(__file__).parents[1] / "support" / "servers" / "task_claimer.py"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("plain", None), ("garbage", "bad_task_answer"), ("unshaped", "output_schema")],
)
async def test_a_server_that_answers_a_task_call_its_own_way(
    broker: Broker, answer: str, expected: str | None
) -> None:
    """Tell the peer's words from the transport's: a server listing a tool as task-only
    that answers the task's `tools/call` with a plain result has answered (its result is
    the reply); one that answers with neither a task nor a result has answered badly
    (`tool_error`), and the server stays up for the next call. A task's result is checked
    against the tool's outputSchema as a plain call's is (issue 32)."""
    server = {"command": sys.executable, "args": [str(CLAIMER)], "env": {"TB_TASK_ANSWER": answer}}
    settings = make_settings(broker, mcpServers={"claimer": server})
    async with running_worker(settings, []), Caller(broker.url) as caller:
        prefix = settings.topic_prefix
        for n in range(2):
            reply, _ = await caller.call(
                f"{prefix}/call/report",
                {"id": f"r{n}", "arguments": {"topic": "bees"}},
                reply_topic=f"{prefix}/reply/claimer",
                timeout_s=CALL_S,
            )
            if expected is None:
                assert reply["ok"] is True and "report on bees" in json.dumps(reply["result"])
            else:
                assert reply["error"]["code"] == "tool_error"
                assert reply["error"]["details"]["reason"] == expected
