"""MCP servers of both current protocol eras, in full (issue 32, Deliver 4), from the
outside: a real broker, a real `toolbus serve`, and two real MCP server processes of the
tests' own (`servers/eras.py`): `modern`, which speaks 2026-07-28 to a client that asks
`server/discover`, and `legacy`, a 2025-11-25 server that knows no `server/discover`.

Before, toolbus opened every session with `initialize`, so it never spoke 2026-07-28: no
list change reached it from a server that sends them only on `subscriptions/listen`, and
the per-request `_meta` stamps of that era never left it. Structured content that was not
an object was dropped; a result breaking the tool's `outputSchema` was `internal`; tool
lists left out `outputSchema` and `execution`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter

from tests.support.harness import Broker
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.processes import RUN_BOUND_S, Serve, serve_env
from toolbus.wire.topics import Topics

ROOT = Path(__file__).parents[2]  # run as a module from here: it imports `legacy_only`
MODERN, LEGACY = "2026-07-28", "2025-11-25"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SECRET = "the-callers-secret-value"
COUNT_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}
FORBIDDEN = {"taskSupport": "forbidden"}  # `execution`: a 2025-11-25 field only


@dataclass
class Worker:
    serve: Serve
    caller: Caller
    topics: Topics
    statuses: dict[str, dict[str, Any]]  # server -> its last status

    async def call(self, tool: str, arguments: dict[str, Any] | None = None, **fields: Any) -> Any:
        body = {"tool": tool, "arguments": arguments or {}, **fields}
        reply, _ = await self.caller.call(
            self.topics.call, body, reply_topic=reply_topic_for(self.topics), timeout_s=30
        )
        return reply

    async def tools(self, **body: Any) -> dict[str, Any]:
        reply, _ = await self.caller.call(
            self.topics.tools, body, reply_topic=reply_topic_for(self.topics), timeout_s=30
        )
        assert reply["ok"], reply
        return dict(reply["result"]["structured"])


def eras_server(**env: str) -> dict[str, Any]:
    args = ["-m", "tests.support.servers.eras"]
    return {"command": sys.executable, "args": args, "cwd": str(ROOT), "env": env}


@pytest.fixture(scope="module")
async def worker(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Worker]:
    servers = tmp_path_factory.mktemp("eras") / "mcp.json"
    mcp = {
        "modern": eras_server(),
        "legacy": eras_server(TB_ERA="legacy"),
        "devices": {"command": "toolbus", "disabled": True},  # the bundled demo: not here
    }
    servers.write_text(json.dumps({"mcpServers": mcp}))
    prefix = f"er{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix, "toolbus", (f"{prefix}/reply/",))
    env = serve_env(topic_prefix=prefix)
    async with (
        Serve(env, "--broker", broker.url, "--mcp-config", str(servers)) as serve,
        Caller(broker.url) as caller,
    ):
        await caller.subscribe(f"{prefix}/status/servers/+/+")
        statuses: dict[str, dict[str, Any]] = {}
        async with asyncio.timeout(RUN_BOUND_S):
            while {s.get("state") for s in statuses.values()} != {"ready"} or len(statuses) < 2:
                status = json.loads((await caller.next_message(RUN_BOUND_S)).payload)
                statuses[status["server"]] = status
        yield Worker(serve, caller, topics, statuses)


async def test_each_server_is_spoken_to_in_the_newest_version_it_speaks(worker: Worker) -> None:
    assert worker.statuses["modern"]["protocol_version"] == MODERN
    assert worker.statuses["legacy"]["protocol_version"] == LEGACY
    await worker.serve.wait_for(f"MCP server modern speaks protocol {MODERN}")


async def test_structured_content_of_any_json_value_is_carried(worker: Worker) -> None:
    reply = await worker.call("modern.numbers")
    assert reply["ok"], reply
    assert reply["result"]["structured"] == [1, 2.5, 3]
    for server in ("modern", "legacy"):  # an object, as before
        reply = await worker.call(f"{server}.count", {"n": 3})
        assert reply["ok"] and reply["result"]["structured"] == {"n": 3}, reply


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_a_result_that_breaks_its_output_schema_is_that_calls_tool_error(
    worker: Worker, server: str
) -> None:
    broken = await worker.call(f"{server}.count", {"n": SECRET})
    assert not broken["ok"], broken
    error = broken["error"]
    assert error["code"] == "tool_error"
    assert error["details"]["reason"] == "output_schema"
    assert error["details"]["errors"] == [{"path": "/n", "keyword": "type"}]
    assert SECRET not in json.dumps(broken)  # where and which rule, never the value
    missing = await worker.call(f"{server}.unshaped")
    assert missing["error"]["code"] == "tool_error", missing
    assert missing["error"]["details"]["reason"] == "output_schema"
    # It cost that call only: the session and the tool go on.
    again = await worker.call(f"{server}.count", {"n": 4})
    assert again["ok"] and again["result"]["structured"] == {"n": 4}, again


def _by_origin(tools: list[dict[str, Any]], origin: str) -> dict[str, dict[str, Any]]:
    return {t["originalName"] or t["name"]: t for t in tools if t["origin"] == origin}


async def test_tool_lists_carry_output_schema_annotations_and_execution(worker: Worker) -> None:
    ours = await worker.tools()
    for server in ("modern", "legacy"):
        count = next(
            t for t in ours["tools"] if t["origin"] == f"mcp:{server}" and "count" in t["name"]
        )
        assert count["outputSchema"] == COUNT_SCHEMA
        assert count["annotations"] == READ_ONLY
        assert count.get("execution") == (FORBIDDEN if server == "legacy" else None)
    echo = next(t for t in ours["tools"] if t["name"] == "echo")
    assert not {"outputSchema", "annotations", "execution", "title"} & set(echo)

    mcp = await worker.tools(format="mcp")
    counts = [t for t in mcp["tools"] if "count" in t["name"]]
    assert {json.dumps(t.get("execution")) for t in counts} == {"null", json.dumps(FORBIDDEN)}
    assert all(t["outputSchema"] == COUNT_SCHEMA and t["annotations"] == READ_ONLY for t in counts)

    responses = await worker.tools(format="openai-responses")
    TypeAdapter(list[FunctionToolParam]).validate_python(responses["tools"])
    shown = [t for t in responses["tools"] if "count" in t["name"]]
    assert len(shown) == 2 and all(t["output_schema"] == COUNT_SCHEMA for t in shown)

    # No place in these providers' definitions: beside them, under `mcp`, by provider name.
    adapters: dict[str, TypeAdapter[Any]] = {
        "anthropic": TypeAdapter(list[ToolParam]),
        "openai": TypeAdapter(list[ChatCompletionFunctionToolParam]),
        "ollama": TypeAdapter(list[ChatCompletionFunctionToolParam]),
    }
    for name, adapter in adapters.items():
        listed = await worker.tools(format=name)
        adapter.validate_python(listed["tools"])  # still exactly what the SDK takes
        fields = [{*t, *t.get("function", {})} for t in listed["tools"]]
        assert not any({"outputSchema", "annotations", "execution"} & f for f in fields), name
        beside = [v for k, v in listed["mcp"].items() if "count" in k]
        assert len(beside) == 2, (name, listed["mcp"])
        assert {json.dumps(v.get("execution")) for v in beside} == {
            "null",
            json.dumps(FORBIDDEN),
        }
        assert all(v["outputSchema"] == COUNT_SCHEMA for v in beside)
        assert all(v["annotations"] == READ_ONLY for v in beside)


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_resource_links_and_embedded_resources_reach_the_caller(
    worker: Worker, server: str
) -> None:
    reply = await worker.call(f"{server}.links")
    assert reply["ok"], reply
    assert reply["result"]["text"] == "see these"
    link, memo, blob = reply["result"]["content"]
    assert link == {
        "type": "resource_link",
        "uri": "file:///srv/report.pdf",
        "name": "report",
        "mime_type": "application/pdf",
    }
    assert (memo["type"], memo["uri"], memo["text"]) == (
        "resource",
        "memo://today",
        "the memo's text",
    )
    assert (blob["type"], blob["uri"], blob["data"]) == ("resource", "blob://one", "AAFieXRlcw==")


@pytest.mark.parametrize("server", ["modern", "legacy"])
async def test_the_request_meta_holds_the_sdks_stamps_and_our_trace_context(
    worker: Worker, server: str
) -> None:
    reply = await worker.call(f"{server}.meta", traceparent=TRACEPARENT)
    assert reply["ok"], reply
    meta = reply["result"]["structured"]["meta"]
    assert meta["traceparent"].split("-")[1] == TRACE_ID  # ours, not clobbered
    stamped = {k: v for k, v in meta.items() if k.startswith("io.modelcontextprotocol/")}
    if server == "legacy":
        assert stamped == {}  # the handshake era stamps nothing per request
    else:  # the SDK's 2026-07-28 stamps, not clobbered by ours
        assert stamped["io.modelcontextprotocol/protocolVersion"] == MODERN
        assert stamped["io.modelcontextprotocol/clientInfo"]["name"]
        assert "io.modelcontextprotocol/clientCapabilities" in stamped


async def test_a_list_change_sent_on_subscriptions_listen_updates_the_tools(
    worker: Worker,
) -> None:
    before = await worker.tools()
    assert not any(t["name"].endswith("grown") for t in before["tools"])
    assert (await worker.call("modern.grow"))["ok"]
    async with asyncio.timeout(10):
        await worker.serve.wait_for("mcp tools changed")
    after = await worker.tools()
    assert "mcp:modern" in {t["origin"] for t in after["tools"] if t["name"].endswith("grown")}
    reply = await worker.call("modern.grown")
    assert reply["ok"] and reply["result"]["text"] == "grown here", reply
