"""Seed 001, the tool-execution spec: centralized execution, the registry, tool definitions
and the executor interface, seen from a caller over MQTT (a real broker, a worker with
the demo device server and local tools)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio

from tests.acceptance.parts import SEARCH, call
from tests.support.harness import DEMO_SERVER, Broker, make_settings, running_worker
from tests.support.logwait import LogSeen, watching
from tests.support.mqtt import Caller
from tests.support.tools import Probe, probe_tools
from toolbus import Client
from toolbus.backends.local.functions import tool
from toolbus.worker.service import Worker


@tool(name="list_devices")
async def local_list_devices() -> dict[str, str]:
    """A local tool sharing its name with the demo server's `list_devices`."""
    return {"from": "local"}


@dataclass
class Running:
    worker: Worker
    registry_log: LogSeen  # what the registry said while the tools were registered


@pytest_asyncio.fixture(scope="module")
async def running(broker: Broker) -> AsyncIterator[Running]:
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER})
    tools = [*probe_tools(Probe()), SEARCH, local_list_devices]
    with watching("toolbus.registry", "list_devices", logging.WARNING) as registry_log:
        async with running_worker(settings, tools) as worker:
            assert worker.mcp.states() == {"devices": "ready"}
            yield Running(worker, registry_log)


async def test_a_tool_runs_by_its_name(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Execute tool by name"."""
    reply = await call(
        caller, running.worker, "control_zwave_device", {"deviceName": "Switch One", "action": "on"}
    )
    assert (reply["ok"], reply["tool"]) == (True, "control_zwave_device"), reply
    assert reply["result"]["structured"]["device"]["state"] == "on"


async def test_each_call_is_one_log_line(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Log tool execution".

    One line per call, `call`, with the tool, the outcome and the duration. Deliberate
    differences: the arguments appear as names and sizes (their values only with
    `log_arguments = true`), and the result as its outcome, not its content: both may be
    personal data.
    """
    with watching("toolbus.execute", "call") as logged:
        reply = await call(caller, running.worker, "echo", {"text": "hello"})
    [line] = [vars(r) for r in logged.records if vars(r).get("call_id") == reply["id"]]
    assert (line["tool"], line["outcome"]) == ("echo", "ok")
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert line["argument_bytes"] == {"text": len('"hello"')}
    assert "arguments" not in line


async def test_an_unknown_tool_is_answered_unknown_tool(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Handle unknown tool".

    The caller gets `unknown_tool` with the closest names. Deliberate difference: the
    worker logs it on the call line (`outcome: unknown_tool`) at INFO, not as a warning: a
    caller's wrong name is not the worker's problem.
    """
    with watching("toolbus.execute", "call") as logged:
        reply = await call(caller, running.worker, "control_zwave", {"device_name": "Switch One"})
    assert reply["error"]["code"] == "unknown_tool"
    assert "control_zwave_device" in reply["error"]["details"]["candidates"]
    [line] = [vars(r) for r in logged.records if vars(r).get("call_id") == reply["id"]]
    assert line["outcome"] == "unknown_tool"


async def test_a_failing_tool_is_logged_and_answered(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Handle tool execution error".

    The caller gets `tool_error` naming the exception; the log has an error line with the
    tool, the exception type and where it was raised.
    """
    with watching("toolbus.local", "local tool raised", logging.ERROR) as logged:
        reply = await call(caller, running.worker, "explode", {"reason": "kaput"})
    assert reply["error"]["code"] == "tool_error"
    assert reply["error"]["details"]["exception"] == "ValueError"
    [line] = [vars(r) for r in logged.records]
    assert (line["tool"], line["exception_type"]) == ("explode", "ValueError")
    assert "raise ValueError" in line["stack"]


async def test_every_tool_is_registered_at_startup(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Register tool at startup".

    Built-in, installed and MCP tools are all there once the worker runs: nothing to call.
    """
    names = {t["name"] for t in await caller.list_tools(running.worker.topics)}
    assert {"datetime", "echo", "search", "busy", "explode"} <= names
    assert {"control_zwave_device", "get_device_sensor_data"} <= names


async def test_tool_definitions_come_in_the_models_format(broker: Broker, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Get tool definition".

    `toolbus.Client.tools(format=...)` gives every definition in the shape a provider's
    API takes (Anthropic's `input_schema`, OpenAI's `function.parameters`).
    """
    prefix = running.worker.topics.prefix
    async with Client(broker.url, prefix=prefix) as client:
        anthropic = await client.tools(format="anthropic")
        openai = await client.tools(format="openai")
    [zwave] = [t for t in anthropic if t["name"] == "control_zwave_device"]
    assert set(zwave) >= {"name", "description", "input_schema"}
    assert zwave["input_schema"]["required"] == ["deviceName", "action"]
    [function] = [t for t in openai if t["function"]["name"] == "control_zwave_device"]
    assert function["type"] == "function"
    assert function["function"]["parameters"]["required"] == ["deviceName", "action"]


async def test_any_name_of_a_tool_finds_its_executor(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Get tool executor function".

    The registry finds a tool's executor from its name, its server-qualified name or
    another spelling, and all reach the same MCP tool.
    """
    for name in ("control_zwave_device", "devices.control_zwave_device", "ControlZwaveDevice"):
        reply = await call(
            caller, running.worker, name, {"deviceName": "Switch Two", "action": "on"}
        )
        assert (reply["ok"], reply["tool"]) == (True, "control_zwave_device"), reply
        assert reply["result"]["structured"]["received"]["deviceName"] == "Switch Two"


async def test_every_definition_has_name_description_and_schema(
    caller: Caller, running: Running
) -> None:
    """Seed 001_a4be83c33a199967.txt: "Validate tool definition"."""
    listed = await caller.list_tools(running.worker.topics)
    names = [t["name"] for t in listed]
    assert len(names) == len(set(names))
    for definition in listed:
        assert isinstance(definition["description"], str) and definition["description"]
        assert definition["inputSchema"]["type"] == "object"


async def test_a_duplicate_name_keeps_both_tools_reachable(
    caller: Caller, running: Running
) -> None:
    """Seed 001_a4be83c33a199967.txt: "Ensure tool uniqueness".

    Deliberate difference: the seed overwrites the earlier registration; toolbus keeps
    both. The bare name goes to the local tool (configured in this process on purpose),
    the server's stays reachable by its qualified name, and a warning names both.
    """
    assert running.registry_log.seen.is_set()
    [warning] = [r.getMessage() for r in running.registry_log.records]
    assert "MCP server devices" in warning and "devices.list_devices" in warning
    bare = await call(caller, running.worker, "list_devices", {})
    assert bare["result"]["structured"] == {"from": "local"}
    qualified = await call(caller, running.worker, "devices.list_devices", {})
    assert "devices" in qualified["result"]["structured"]
    names = {t["name"] for t in await caller.list_tools(running.worker.topics)}
    assert {"list_devices", "devices.list_devices"} <= names


async def test_an_executor_receives_one_object_of_arguments(
    caller: Caller, running: Running
) -> None:
    """Seed 001_a4be83c33a199967.txt: "Tool executor signature"."""
    arguments = {"query": "lamps", "page": 2, "filters": {"room": "hall"}}
    reply = await call(caller, running.worker, "search", arguments)
    assert reply["result"]["structured"]["received"] == arguments


async def test_an_executor_answers_with_text(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Tool executor return value".

    A result always has `text` (a string describing it); a structured result keeps its
    structure beside it.
    """
    plain = await call(caller, running.worker, "sleepy", {"seconds": 0})
    assert plain["result"]["text"] == "woke up"
    structured = await call(
        caller, running.worker, "get_device_sensor_data", {"deviceName": "Hallway Sensor"}
    )
    assert isinstance(structured["result"]["text"], str)
    assert "Hallway Sensor" in structured["result"]["text"]
    assert structured["result"]["structured"]["temperature_c"] == 21.5


async def test_an_executor_error_describes_itself(caller: Caller, running: Running) -> None:
    """Seed 001_a4be83c33a199967.txt: "Tool executor error handling".

    A tool raises one of toolbus's errors with a message meant for the caller; the reply
    carries its code, message and details (here: which parameter).
    """
    reply = await call(caller, running.worker, "datetime", {"timezone": "Mars/Olympus_Mons"})
    assert reply["error"]["code"] == "invalid_arguments"
    assert reply["error"]["details"]["parameter"] == "timezone"
    assert "Mars/Olympus_Mons" in reply["error"]["message"]
