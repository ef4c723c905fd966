"""A tool list asked while an MCP server starts (issue 30, point 4), from the outside: a
real `toolbus serve`, a real broker, a real MCP server process whose start the test holds
at a gate (a FIFO it writes to) and lets go when it chooses.

Before, the list was `ok` with the local tools only while the server was `connecting`,
and said nothing of it: a caller that lists once never saw the server's tools. Now the
list waits for it within the request's deadline, as a call to its tool does; a list whose
deadline comes first names the server in `pending`, in every format, beside definitions
that stay what the provider's SDK takes.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import TypeAdapter

from tests.backends.test_mcp_faults import misbehaving
from tests.cli.test_cli import cli_env, run_cli
from tests.support.harness import Broker
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.processes import RUN_BOUND_S, Serve, serve_env
from toolbus.wire.topics import Topics

WAITS = "tool list waits for MCP servers starting"  # the worker's log line as a list waits


@dataclass
class Gated:
    """A serving worker whose one MCP server, `gated`, waits at its gate."""

    serve: Serve
    caller: Caller
    topics: Topics
    broker_url: str
    gate: int  # the FIFO, held open: a byte written lets the server start

    def open_gate(self) -> None:
        os.write(self.gate, b"g")

    async def tools(self, **body: Any) -> dict[str, Any]:
        reply, _ = await self.caller.call(
            self.topics.tools, body, reply_topic=reply_topic_for(self.topics), timeout_s=60
        )
        return reply


@asynccontextmanager
async def gated_worker(broker: Broker, tmp_path: Path) -> AsyncIterator[Gated]:
    gate_path = tmp_path / "gate"
    os.mkfifo(gate_path)
    gate = os.open(gate_path, os.O_RDWR)  # never blocks on Linux; the server's read will
    servers = tmp_path / "mcp.json"
    server = {**misbehaving(tmp_path, TB_START_GATE=str(gate_path)), "connect_timeout_s": 120}
    # The bundled config's demo server is left out: `gated` is the only one.
    bundled = {"command": "toolbus", "disabled": True}
    servers.write_text(json.dumps({"mcpServers": {"gated": server, "devices": bundled}}))
    prefix = f"tl{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix, "toolbus", (f"{prefix}/reply/",))
    env = serve_env(topic_prefix=prefix)
    try:
        async with (
            Serve(env, "--broker", broker.url, "--mcp-config", str(servers)) as serve,
            Caller(broker.url) as caller,
        ):
            await caller.subscribe(f"{prefix}/status/workers/+")
            async with asyncio.timeout(RUN_BOUND_S):  # online: it answers requests now
                while True:
                    status = json.loads((await caller.next_message(RUN_BOUND_S)).payload)
                    if status["state"] == "online":
                        states = {name: s["state"] for name, s in status["servers"].items()}
                        assert states == {"gated": "connecting"}, status
                        break
            yield Gated(serve, caller, topics, broker.url, gate)
    finally:
        os.close(gate)


async def test_a_list_asked_while_a_server_connects_waits_and_lists_its_tools(
    broker: Broker, tmp_path: Path
) -> None:
    async with gated_worker(broker, tmp_path) as worker:
        asking = asyncio.create_task(worker.tools(timeout_s=60))
        waiting = asyncio.create_task(worker.serve.wait_for(WAITS))
        done, _ = await asyncio.wait(
            {asking, waiting}, timeout=RUN_BOUND_S, return_when=asyncio.FIRST_COMPLETED
        )
        waiting.cancel()
        if asking not in done:  # the worker holds the list for the server: let it start
            worker.open_gate()
        reply = await asking
    assert reply["ok"], reply
    listed = {t["name"]: t["origin"] for t in reply["result"]["structured"]["tools"]}
    assert listed.get("work") == "mcp:gated", sorted(listed)
    assert listed["echo"] == "local"
    assert reply["result"]["structured"]["pending"] == []


async def test_a_list_whose_deadline_comes_first_names_the_pending_server(
    broker: Broker, tmp_path: Path
) -> None:
    async with gated_worker(broker, tmp_path) as worker:
        ours = await worker.tools(timeout_s=0.3)
        anthropic = await worker.tools(timeout_s=0.3, format="anthropic")
        openai = await worker.tools(toolbus={"timeout_s": 0.3, "format": "openai"})
        worker.open_gate()  # and once it is up, a list is whole again
        later = await worker.tools(timeout_s=60)
    pending = [{"server": "gated", "state": "connecting"}]
    for reply in (ours, anthropic, openai):
        assert reply["ok"], reply
        assert reply["result"]["structured"]["pending"] == pending
    assert "echo" in {t["name"] for t in ours["result"]["structured"]["tools"]}
    assert "work" not in {t["name"] for t in ours["result"]["structured"]["tools"]}
    # The definitions are still what each SDK takes; `pending` sits beside them.
    TypeAdapter(list[ToolParam]).validate_python(anthropic["result"]["structured"]["tools"])
    TypeAdapter(list[ChatCompletionFunctionToolParam]).validate_python(
        openai["result"]["structured"]["tools"]
    )
    assert later["result"]["structured"]["pending"] == []
    assert "work" in {t["name"] for t in later["result"]["structured"]["tools"]}


async def test_toolbus_tools_says_which_servers_are_not_ready(
    broker: Broker, tmp_path: Path
) -> None:
    async with gated_worker(broker, tmp_path) as worker:
        env = cli_env(worker.topics.prefix)
        asked = ("tools", "--broker", worker.broker_url, "--timeout", "1", "--json")
        code, out, err = await run_cli(*asked, env=env)
    assert code == 0, err
    assert "echo" in {t["name"] for t in json.loads(out)}  # stdout: the definitions alone
    assert "MCP servers not ready, their tools may be missing: gated (connecting)" in err
