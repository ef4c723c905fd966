"""Seeds 000 (the spec delta) and 001 (the spec, which repeats it): MCP tool parameter name
normalization, over MQTT, against the demo Z-Wave MCP server (camelCase parameters
`deviceName`, `action`, `level`) with the bundled static map, and a third-party MCP server
(the MCP project's server-everything, TypeScript SDK, camelCase too)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from tests.acceptance.parts import SEARCH, VOLUME, call, renames
from tests.support.harness import DEMO_SERVER, Broker, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from toolbus.worker.service import Worker


@pytest_asyncio.fixture(scope="module")
async def worker(broker: Broker, everything_server: dict[str, Any]) -> AsyncIterator[Worker]:
    """The demo device server with the bundled static map, a third-party server, and the
    seed's built-ins."""
    servers = {"devices": DEMO_SERVER, "everything": everything_server}
    async with running_worker(
        make_settings(broker, mcpServers=servers), [SEARCH, VOLUME]
    ) as running:
        assert running.mcp.states() == {"devices": "ready", "everything": "ready"}
        yield running


async def test_snake_case_arguments_reach_the_mcp_server_in_camel_case(
    caller: Caller, worker: Worker
) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt:
    "Snake_case to camelCase conversion for MCP tools".

    The tool list shows the server's own camelCase schema (toolbus does not rewrite it);
    an AI that answers in snake_case anyway still reaches the server in camelCase, on the
    demo server as on a third-party one (whose tool names use hyphens: any spelling works).
    """
    [listed] = [
        t for t in await caller.list_tools(worker.topics) if t["name"] == "control_zwave_device"
    ]
    assert set(listed["inputSchema"]["properties"]) == {"deviceName", "action", "level"}
    control = await call(
        caller, worker, "control_zwave_device", {"device_name": "Switch Two", "command": "off"}
    )
    assert control["ok"], control
    assert control["result"]["structured"]["received"] == {
        "deviceName": "Switch Two",
        "action": "off",
    }
    sensor = await call(caller, worker, "get_device_sensor_data", {"device_name": "Hallway Sensor"})
    assert sensor["ok"], sensor
    assert renames(sensor) == {"device_name": ("deviceName", "snake_to_camel")}
    annotated = await call(
        caller, worker, "get_annotated_message", {"message_type": "success", "include_image": False}
    )
    assert (annotated["ok"], annotated["tool"]) == (True, "get-annotated-message"), annotated
    assert annotated["result"]["text"] == "Operation completed successfully"
    assert renames(annotated) == {
        "message_type": ("messageType", "snake_to_camel"),
        "include_image": ("includeImage", "snake_to_camel"),
    }


async def test_builtin_tools_get_their_arguments_unchanged(caller: Caller, worker: Worker) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt: "Built-in tools are not affected".

    Local tools (built in or installed) name their own parameters: no key is respelled,
    even one an MCP tool would have had renamed (`max_results`). Deliberate difference:
    the seed's `search` and `volume` are not toolbus built-ins (those are `datetime` and
    `echo`); they are local tools here, as a deployment would install them.
    """
    search = await call(caller, worker, "search", {"query": "weather", "max_results": 3})
    assert search["ok"], search
    assert search["result"]["structured"]["received"] == {"query": "weather", "max_results": 3}
    assert search["normalized"] == []
    volume = await call(caller, worker, "volume", {"level": 7, "fade_ms": 200})
    assert volume["result"]["structured"]["received"] == {"level": 7, "fade_ms": 200}
    assert volume["normalized"] == []
    now = await call(caller, worker, "datetime", {"timezone": "Europe/Berlin"})
    assert now["ok"] and now["normalized"] == [], now
    assert now["result"]["structured"]["timezone"] == "Europe/Berlin"


async def test_the_static_map_renames_device_name_and_command(
    caller: Caller, worker: Worker
) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt:
    "Static parameter mappings for known MCP tools".

    The static map is configuration (`[argument_maps.control_zwave_device]` in
    config/toolbus.toml), not code; `command` -> `action` is a change of word no
    respelling could find.
    """
    reply = await call(
        caller, worker, "control_zwave_device", {"device_name": "Switch One", "command": "on"}
    )
    assert reply["ok"], reply
    assert reply["result"]["structured"]["received"] == {"deviceName": "Switch One", "action": "on"}
    assert renames(reply) == {
        "device_name": ("deviceName", "static_map"),
        "command": ("action", "static_map"),
    }


async def test_an_unmapped_snake_case_parameter_is_converted(
    caller: Caller, worker: Worker
) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt:
    "Heuristic conversion for unmapped parameters".

    `new_parameter_name` is in no static map and not in the schema, which accepts other
    properties and is camelCase: it goes on as `newParameterName` (rule `snake_to_camel`).
    A declared parameter is matched to the schema's own spelling, not guessed.
    """
    reply = await call(
        caller,
        worker,
        "control_zwave_device",
        {"device_name": "Switch One", "command": "off", "new_parameter_name": "x"},
    )
    assert reply["ok"], reply
    assert renames(reply)["new_parameter_name"] == ("newParameterName", "snake_to_camel")


async def test_parameters_without_underscores_pass_unchanged(
    caller: Caller, worker: Worker
) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt:
    "Parameters without underscores pass through unchanged"."""
    reply = await call(
        caller,
        worker,
        "control_zwave_device",
        {"device_name": "Living Room Lamp", "command": "dim", "level": 40},
    )
    assert reply["ok"], reply
    assert reply["result"]["structured"]["received"]["level"] == 40
    assert "level" not in renames(reply)
    assert reply["result"]["structured"]["device"]["level"] == 40


async def test_the_transformation_is_logged(caller: Caller, worker: Worker) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt: "Parameter normalization logging".

    The line's text says the transformation, keys only: `{device_name: ..., command: ...}
    -> {deviceName: ..., action: ...}`. Deliberate differences: values are not shown
    (they may be personal data), the arrow is ASCII, and the line is at DEBUG (at INFO a
    worker writes one line per call; the reply's `normalized` and the span carry the same).
    """
    with watching("toolbus.normalize", "normalized control_zwave_device", logging.DEBUG) as seen:
        reply = await call(
            caller, worker, "control_zwave_device", {"device_name": "Switch One", "command": "on"}
        )
        assert reply["ok"], reply
    assert seen.seen.is_set()
    [line] = [r.getMessage() for r in seen.records if r.getMessage().startswith("normalized")]
    assert line == (
        "normalized control_zwave_device: "
        "{device_name: ..., command: ...} -> {deviceName: ..., action: ...}"
    )
    assert "Switch One" not in line


async def test_the_servers_error_comes_back_unchanged(caller: Caller, worker: Worker) -> None:
    """Seeds 000_a217e9feb91caaff.txt, 001_a4be83c33a199967.txt:
    "Error handling with invalid parameters after normalization".

    The demo server refuses `dim` without a level: its text reaches the caller as the
    server wrote it (`tool_error`). Deliberate difference: a missing required field never
    reaches the server; toolbus validates against the server's schema first and answers
    `invalid_arguments` with the parameters the tool takes.
    """
    refused = await call(
        caller,
        worker,
        "control_zwave_device",
        {"device_name": "Living Room Lamp", "command": "dim"},
    )
    assert refused["error"]["code"] == "tool_error"
    assert refused["error"]["message"] == (
        "Error executing tool control_zwave_device: action 'dim' needs a level between 0 and 100"
    )
    missing = await call(caller, worker, "control_zwave_device", {"device_name": "Switch One"})
    assert missing["error"]["code"] == "invalid_arguments"
    assert [p["name"] for p in missing["error"]["details"]["parameters"] if p["required"]] == [
        "deviceName",
        "action",
    ]
