"""Normalization end to end over MQTT: the demo server, a snake_case server, callers."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.harness import DEMO_SERVER, Broker, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from toolbus.worker.service import Worker

SNAKE_SERVER = {
    "command": sys.executable,
    "args": [str(Path(__file__).parents[1] / "support" / "servers" / "snake_server.py")],
}


@pytest_asyncio.fixture(scope="module")
async def two_servers(broker: Broker) -> AsyncIterator[Worker]:
    settings = make_settings(
        broker,
        mcpServers={"devices": DEMO_SERVER, "snake": SNAKE_SERVER},  # devices listed first
        aliases={"lights": "control_zwave_device", "ghost": "no_such_tool"},
        callers={"kitchen": {"tools": ["ControlZwaveDevice", "datetime"]}},
        tools={"echo": {"model_invocable": False}},
    )
    async with running_worker(settings) as worker:
        assert worker.mcp.states() == {"devices": "ready", "snake": "ready"}
        yield worker


async def call(
    client: Caller, worker: Worker, tool: str, arguments: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return await client.call_tool(worker.topics, tool, arguments, **extra)


@pytest.mark.parametrize(
    "name", ["ControlZwaveDevice", "control-zwave-device", "controlzwavedevice", "lights"]
)
async def test_tool_name_spellings_over_mqtt(
    caller: Caller, two_servers: Worker, name: str
) -> None:
    reply = await call(caller, two_servers, name, {"DeviceName": "Switch Two", "command": "off"})
    assert reply["ok"], reply
    assert reply["tool"] == "control_zwave_device"
    assert reply["result"]["structured"]["received"] == {
        "deviceName": "Switch Two",
        "action": "off",
    }
    rules = {n["rule"] for n in reply["normalized"] if n["path"] == "tool"}
    assert rules == ({"alias"} if name == "lights" else {"tool_spelling"})


async def test_camel_arguments_reach_a_snake_case_server(
    caller: Caller, two_servers: Worker
) -> None:
    reply = await call(
        caller,
        two_servers,
        "create_ticket",
        {
            "ticketTitle": "Lamp broken",
            "AssigneeName": "ana",
            "priority": "HIGH",
            "tagList": "hardware",
        },
    )
    assert reply["ok"], reply
    assert reply["result"]["structured"]["received"] == {
        "ticket_title": "Lamp broken",
        "assignee_name": "ana",
        "priority": "high",
        "tag_list": ["hardware"],
    }
    assert {n["rule"] for n in reply["normalized"]} >= {"camel_to_snake", "enum_case", "wrap_array"}


async def test_bare_name_goes_to_the_first_server_and_qualified_names_reach_both(
    caller: Caller, two_servers: Worker
) -> None:
    bare = await call(caller, two_servers, "list_devices", {})
    assert bare["tool"] == "list_devices" and bare["result"]["structured"]["devices"]
    for name in ("snake.list_devices", "snake__list_devices"):
        qualified = await call(caller, two_servers, name, {})
        assert qualified["ok"] and qualified["tool"] == "snake.list_devices"
        assert qualified["result"]["structured"]["server"] == "snake"


async def test_sanitized_tool_name(caller: Caller, two_servers: Worker) -> None:
    tools = {t["name"]: t for t in await caller.list_tools(two_servers.topics)}
    sanitized = [t for t in tools.values() if t.get("originalName") == "weather report!"]
    assert len(sanitized) == 1
    reply = await call(caller, two_servers, sanitized[0]["name"], {"cityName": "Bern"})
    assert reply["ok"] and reply["result"]["text"] == "sunny in Bern"
    assert "echo" not in tools  # not model-invocable: in no list...
    assert (await call(caller, two_servers, "echo", {"text": "x"}))["ok"]  # ...but callable


async def test_caller_profiles_over_mqtt(caller: Caller, two_servers: Worker) -> None:
    allowed = await call(
        caller,
        two_servers,
        "kitchen/control_zwave_device",
        {"device_name": "Switch Two", "command": "on"},
    )
    assert allowed["ok"], allowed
    refused = await call(
        caller, two_servers, "kitchen/create_ticket", {"ticket_title": "t", "assignee_name": "a"}
    )
    assert refused["error"]["code"] == "forbidden"
    also_refused = await call(
        caller,
        two_servers,
        "create_ticket",
        {"ticket_title": "t", "assignee_name": "a"},
        caller="kitchen",
    )
    assert also_refused["error"]["code"] == "forbidden"
    listing = await caller.list_tools(two_servers.topics, caller="kitchen")
    assert sorted(t["name"] for t in listing) == [
        "control_zwave_device",
        "datetime",
    ]


async def test_unknown_alias_and_profile_names_are_reported_at_start_up(broker: Broker) -> None:
    settings = make_settings(
        broker, aliases={"ghost": "no_such_tool"}, callers={"x": {"tools": ["nothing_here"]}}
    )
    with (
        watching("toolbus.execute", "alias ghost", logging.WARNING) as alias_warning,
        watching("toolbus.access", "nothing_here", logging.WARNING) as profile_warning,
    ):
        async with running_worker(settings), asyncio.timeout(10):
            await alias_warning.seen.wait()
            await profile_warning.seen.wait()
