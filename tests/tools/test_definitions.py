"""Tool definitions in the providers' shapes: `{prefix}/tools` with `format`.

In-process through the pipeline (a list publisher, no broker), with MCP tools built the
way the MCP backend builds them (`sanitize_name`, `to_tool`) from names no provider takes:
dots, slashes, spaces, names that collide once respelled, a name past 64 characters.
Every definition is judged by the provider's SDK type (`tests/support/tool_definitions.py`), and
every listed name must reach its own tool. One test goes through a real broker and worker.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import mcp_types
import pytest

from tests.support.harness import ListPublisher
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.tool_definitions import FORMATS, PROVIDER_NAME, checked_name
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.backends.mcp.convert import to_tool
from toolbus.config import NO_TOOL_SETTINGS, Settings
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.registry import Registry, Tool, sanitize_name
from toolbus.wire.contracts import ToolList, ToolResult
from toolbus.wire.formats.names import provider_names
from toolbus.wire.messages import Inbound
from toolbus.worker.service import Worker
from toolbus.worker.wiring import build_executor, build_registry, topics_for

REPLY = "tb/reply/defs"
PROVIDER_FORMATS = [f for f in FORMATS if f != "toolbus"]

# (server, the tool's name as the server announces it, its input schema)
ANNOUNCED: list[tuple[str, str, dict[str, Any]]] = [
    ("fs", "files.read", {"properties": {"path": {"type": "string"}}}),  # no `type`
    ("fs", "files/write", {"type": "object"}),  # no `properties`
    ("fs", "files list", {"type": "object", "properties": {}}),  # a space: sanitized
    ("fs", "files__write", {"type": "object", "properties": {}}),  # fits as it is
    ("x", "a.b", {"type": "object", "properties": {}}),  # `a.b` and `a/b` both respell
    ("y", "a/b", {"type": "object", "properties": {}}),  # to `a__b`
    ("snake", "echo", {"type": "object", "properties": {}}),  # shadowed: `snake.echo`
    ("s1", "y" * 64, {"type": "object", "properties": {}}),
    ("s2", "y" * 64, {"type": "object", "properties": {}}),  # `s2.yyy…`: 67 characters
]


def mcp_tool(server: str, remote: str, schema: dict[str, Any], rank: int) -> Tool:
    """As the MCP backend registers it; the result names the tool that ran."""

    async def invoke(arguments: dict[str, Any], context: CallContext = DETACHED) -> ToolResult:
        return ToolResult(text=f"{server}:{remote}")

    listed = mcp_types.Tool(
        name=remote,
        input_schema=schema,
        description=f"{remote} on {server}",
        title="Read a file" if remote == "files.read" else None,
        annotations=mcp_types.ToolAnnotations(read_only_hint=True)
        if remote == "files.read"
        else None,
    )
    name = sanitize_name(remote)
    return to_tool(listed, name, server=server, rank=rank, settings=NO_TOOL_SETTINGS, invoke=invoke)


@dataclass
class Rig:
    pipeline: Pipeline
    sent: ListPublisher
    registry: Registry

    async def reply(self, topic: str, body: dict[str, Any]) -> dict[str, Any]:
        await self.pipeline.handle(
            Inbound(
                topic=topic,
                payload=json.dumps(body).encode(),
                response_topic=REPLY,
                correlation_data=b"c",
            )
        )
        [out] = self.sent.on(REPLY)
        self.sent.sent.clear()
        return dict(json.loads(out.payload))

    async def listing(self, body: dict[str, Any], topic: str = "tb/tools") -> dict[str, Any]:
        reply = await self.reply(topic, body)
        assert reply["ok"], reply
        return reply


@pytest.fixture
def rig() -> Rig:
    settings = Settings.model_validate(
        {
            "topic_prefix": "tb",
            "callers": {"kitchen": {"tools": ["echo", "fs.files.read", "a/b"]}},
        }
    )
    registry = build_registry(BUILTIN_TOOLS, settings)
    servers = list(dict.fromkeys(server for server, _, _ in ANNOUNCED))
    registry.register_all(
        mcp_tool(server, remote, schema, servers.index(server))
        for server, remote, schema in ANNOUNCED
    )
    executor = build_executor(settings, registry)
    sent = ListPublisher()
    pipeline = Pipeline(
        executor,
        topics_for(settings),
        sent,
        worker_id="w1",
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
    )
    return Rig(pipeline, sent, registry)


@pytest.mark.parametrize("tools_format", PROVIDER_FORMATS)
async def test_every_definition_is_what_the_sdk_takes_and_every_name_comes_back(
    rig: Rig, tools_format: str
) -> None:
    ours = ToolList.model_validate((await rig.listing({}))["result"]["structured"]).tools
    reply = await rig.listing({"format": tools_format})
    definitions = reply["result"]["structured"]["tools"]
    names = [checked_name(tools_format, d) for d in definitions]
    assert len(set(names)) == len(names) == len(ours)
    assert reply["result"]["text"] == ", ".join(names)
    # Listed in the same order as our own format: the n-th name is the n-th tool.
    for name, canonical in zip(names, [t.name for t in ours], strict=True):
        resolved = rig.registry.resolve(name)
        assert (resolved.name, resolved.report) == (canonical, ())
        # Run or refused for its arguments (`echo` needs a text), but by that tool.
        called = await rig.reply("tb/call", {"tool": name, "arguments": {}})
        assert called["tool"] == canonical and called["normalized"] == [], called
        assert called["ok"] or called["error"]["code"] == "invalid_arguments"


async def test_names_that_break_the_rule_or_collide_are_respelled_apart(rig: Rig) -> None:
    reply = await rig.listing({"format": "anthropic"})
    listed = {
        rig.registry.resolve(d["name"]).name: d["name"]
        for d in reply["result"]["structured"]["tools"]
    }
    assert listed["echo"] == "echo" and listed["datetime"] == "datetime"
    assert listed["snake.echo"] == "snake__echo"
    assert listed["files__write"] == "files__write"  # fits: keeps its name
    # `files/write` would be `files__write`, taken: it gets a digest, and so do the two
    # names that would both be `a__b`. Neither keeps the plain spelling.
    assert listed["files/write"].startswith("files__write_")
    assert listed["a.b"].startswith("a__b_") and listed["a/b"].startswith("a__b_")
    assert listed["a.b"] != listed["a/b"]
    assert len(listed[f"s2.{'y' * 64}"]) == 64
    assert listed["files.read"] == "files__read"


async def test_schemas_are_objects_with_properties_for_providers_and_ours_unchanged(
    rig: Rig,
) -> None:
    ours = {
        t["name"]: t["inputSchema"]
        for t in (await rig.listing({}))["result"]["structured"]["tools"]
    }
    assert ours["files.read"] == {"properties": {"path": {"type": "string"}}}
    assert ours["files/write"] == {"type": "object"}
    anthropic = {
        rig.registry.resolve(d["name"]).name: d["input_schema"]
        for d in (await rig.listing({"format": "anthropic"}))["result"]["structured"]["tools"]
    }
    assert anthropic["files.read"] == {
        "type": "object",
        "properties": {"path": {"type": "string"}},
    }
    assert anthropic["files/write"] == {"type": "object", "properties": {}}


async def test_the_mcp_format_keeps_the_servers_title_and_annotations(rig: Rig) -> None:
    reply = await rig.listing({"format": "mcp"})
    [read] = [d for d in reply["result"]["structured"]["tools"] if d["name"] == "files__read"]
    assert read["title"] == "Read a file"
    assert read["annotations"] == {"readOnlyHint": True}
    assert read["description"] == "files.read on fs"


@pytest.mark.parametrize("tools_format", ["anthropic", "openai"])
async def test_a_caller_sees_only_its_own_tools(rig: Rig, tools_format: str) -> None:
    by_topic = await rig.listing({"format": tools_format}, topic="tb/tools/kitchen")
    by_body = await rig.listing({"caller": "kitchen", "toolbus": {"format": tools_format}})
    for reply in (by_topic, by_body):
        names = [checked_name(tools_format, d) for d in reply["result"]["structured"]["tools"]]
        assert {rig.registry.resolve(n).name for n in names} == {"echo", "files.read", "a/b"}
    everyone = await rig.listing({"format": tools_format})
    assert len(everyone["result"]["structured"]["tools"]) > 3


@pytest.mark.parametrize(
    "body", [{"format": "gemini"}, {"toolbus": {"format": "gemini"}}, {"format": 3}]
)
async def test_an_unknown_format_is_a_bad_request(rig: Rig, body: dict[str, Any]) -> None:
    reply = await rig.reply("tb/tools", body)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request"


def test_provider_names_are_a_function_of_the_set_alone() -> None:
    names = [
        "echo",
        "a.b",
        "a/b",
        "a__b",
        "a_b",
        "srv.tool",
        "srv/tool",
        "x" * 64,
        "q." + "x" * 64,
        "q/" + "x" * 64,
        "w.hat ever",
    ]
    table = provider_names(names)
    shuffled = names[:]
    for seed in range(5):
        random.Random(seed).shuffle(shuffled)
        assert provider_names(shuffled) == table
    assert len(set(table.values())) == len(names)
    assert all(PROVIDER_NAME.match(p) for p in table.values())
    assert {n: table[n] for n in ("echo", "a__b", "a_b", "x" * 64)} == {
        n: n for n in ("echo", "a__b", "a_b", "x" * 64)
    }
    assert table["srv.tool"] != table["srv/tool"]


def test_a_tool_leaving_gives_its_rival_the_plain_spelling_back(rig: Rig) -> None:
    rig.registry.unregister_origin("mcp:y")  # `a/b` goes; `a.b` alone respells to `a__b`
    [a_b] = [t for t in rig.registry.tools() if t.qualified_name == "x.a.b"]
    assert rig.registry.provider_name(a_b) == "a__b"
    assert rig.registry.resolve("a__b").tool is a_b


# -- through a real broker and worker ---------------------------------------------------


@pytest.mark.parametrize(
    ("body", "tools_format"),
    [({"format": "anthropic"}, "anthropic"), ({"toolbus": {"format": "openai"}}, "openai")],
)
async def test_definitions_over_mqtt(
    caller: Caller, demo_worker: Worker, body: dict[str, Any], tools_format: str
) -> None:
    topics = demo_worker.topics
    reply, _ = await caller.call(topics.tools, body, reply_topic=reply_topic_for(topics))
    assert reply["ok"], reply
    names = [checked_name(tools_format, d) for d in reply["result"]["structured"]["tools"]]
    assert {"echo", "datetime", "control_zwave_device"} <= set(names)
