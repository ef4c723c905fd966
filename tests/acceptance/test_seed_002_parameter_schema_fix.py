"""Seed 002, the proposal fix-mcp-tool-parameter-schema: its success criteria, against
`toolbus serve` as `make run` starts it (the bundled config: the demo Z-Wave server and
its static map), at log level DEBUG, its log read from its stderr as an operator would."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio

from tests.support.harness import Broker, unique_prefix
from tests.support.mqtt import Caller
from tests.support.processes import RUN_BOUND_S, Serve, serve_env
from tests.support.providers import anthropic_message_model, tool_use
from toolbus import Client
from toolbus.config import Settings
from toolbus.wire.topics import Topics

BIN = Path(sys.executable).parent  # the bundled config runs `toolbus demo-server` from PATH
# What the AI sent in the seed's log, for "Turn on switch one".
SEED_CALL = {"device_name": "Switch One", "command": "on"}


@dataclass
class Served:
    serve: Serve
    topics: Topics
    broker_url: str

    def lines(self) -> list[dict[str, Any]]:
        """Its JSON log lines so far (off a terminal, one object per line)."""
        return [json.loads(line) for line in self.serve.stderr if line.startswith("{")]


@pytest_asyncio.fixture(scope="module")
async def served(broker: Broker) -> AsyncIterator[Served]:
    prefix = unique_prefix()
    env = serve_env(topic_prefix=prefix, log_level="DEBUG")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    settings = Settings(topic_prefix=prefix)
    topics = Topics(settings.topic_prefix, settings.shared_group, settings.allowed_reply_prefixes)
    async with Serve(env, "--broker", broker.url) as serve, Caller(broker.url) as watcher:
        await watcher.subscribe(topics.server_status("devices", "+"))
        async with asyncio.timeout(RUN_BOUND_S):
            while json.loads((await watcher.next_message(RUN_BOUND_S)).payload)["state"] != "ready":
                pass
        yield Served(serve, topics, broker.url)


async def test_turn_on_switch_one_turns_it_on(served: Served, caller: Caller) -> None:
    """Seed 002_4b93545e54e35234.txt: "Device control works".

    The model's answer to "Turn on switch one", as the seed's log shows it
    (`{device_name: "Switch One", command: "on"}`), run through `toolbus.Client`: the
    device is on, and says so when asked.
    """
    message = anthropic_message_model(tool_use("toolu_on", "control_zwave_device", SEED_CALL))
    async with Client(served.broker_url, prefix=served.topics.prefix) as client:
        [turn] = await client.run_tool_calls(message)
    [result] = turn["content"]
    assert "is_error" not in result, result
    state = await caller.call_tool(
        served.topics, "get_device_sensor_data", {"device_name": "Switch One"}
    )
    assert state["result"]["structured"]["state"] == "on"


async def test_the_log_shows_the_normalization(served: Served, caller: Caller) -> None:
    """Seed 002_4b93545e54e35234.txt: "Logs show parameter normalization".

    At DEBUG the worker's log has a line whose text is the transformation, keys only:
    `{device_name: ..., command: ...} -> {deviceName: ..., action: ...}` (values left out:
    they may be personal data; the arrow is ASCII).
    """
    reply = await caller.call_tool(served.topics, "control_zwave_device", SEED_CALL)
    assert reply["ok"], reply
    await served.serve.wait_for("normalized control_zwave_device")
    events = [line["event"] for line in served.lines() if line["event"].startswith("normalized")]
    assert (
        "normalized control_zwave_device: "
        "{device_name: ..., command: ...} -> {deviceName: ..., action: ...}"
    ) in events


async def test_the_builtin_tools_still_work(served: Served, caller: Caller) -> None:
    """Seed 002_4b93545e54e35234.txt: "No regressions".

    The built-in tools answer beside the normalized MCP tools, their arguments untouched.
    Deliberate difference: toolbus's built-ins are `datetime` and `echo` (the seed's
    `search` and `volume` belong to its voice gateway).
    """
    now = await caller.call_tool(served.topics, "datetime", {"timezone": "UTC"})
    assert now["ok"] and now["normalized"] == [], now
    echoed = await caller.call_tool(served.topics, "echo", {"text": "device_name"})
    assert echoed["result"]["structured"]["text"] == "device_name"
    assert echoed["normalized"] == []


async def test_the_server_receives_camel_case(served: Served, caller: Caller) -> None:
    """Seed 002_4b93545e54e35234.txt: "MCP server receives correct parameter names in camelCase".

    Seen from the server: its answer echoes what it received, and its own debug line (on
    its stderr, relayed into the worker's log) names the keys it got.
    """
    call = {"device_name": "Switch Two", "command": "on"}
    reply = await caller.call_tool(served.topics, "control_zwave_device", call)
    assert reply["result"]["structured"]["received"] == {"deviceName": "Switch Two", "action": "on"}
    await served.serve.wait_for("control_zwave_device received")
    relayed = [line["event"] for line in served.lines() if line.get("server") == "devices"]
    assert any(e.endswith("control_zwave_device received deviceName, action") for e in relayed)
    assert not any("device_name" in e for e in relayed)


async def test_invalid_parameters_are_still_refused_clearly(served: Served, caller: Caller) -> None:
    """Seed 002_4b93545e54e35234.txt: "Error handling".

    Renamed or not, a wrong value is refused: `invalid_arguments` names the parameter by
    the server's name, with the values it takes; a device the server does not know is
    the server's own `tool_error`, its text unchanged.
    """
    wrong = await caller.call_tool(
        served.topics, "control_zwave_device", {"device_name": "Switch One", "command": "toggle"}
    )
    assert wrong["error"]["code"] == "invalid_arguments"
    assert [e["path"] for e in wrong["error"]["details"]["errors"]] == ["action"]
    [action] = [p for p in wrong["error"]["details"]["parameters"] if p["name"] == "action"]
    assert action["enum"] == ["on", "off", "dim"]
    unknown = await caller.call_tool(
        served.topics, "control_zwave_device", {"device_name": "Garage", "command": "on"}
    )
    assert unknown["error"]["code"] == "tool_error"
    assert unknown["error"]["message"].startswith(
        "Error executing tool control_zwave_device: Unknown device 'Garage'"
    )
