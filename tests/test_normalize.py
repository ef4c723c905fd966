"""Seed normalization: static maps, snake->camel, values untouched, local tools left alone."""

from __future__ import annotations

from typing import Any

import pytest

from worker.contracts import ToolResult
from worker.errors import InvalidArguments
from worker.normalize import Normalizer, snake_to_camel
from worker.registry import Tool

SCHEMA = {
    "type": "object",
    "properties": {
        "deviceName": {"type": "string"},
        "action": {"type": "string"},
        "level": {"type": "integer"},
        "room": {},
    },
}


async def _noop(arguments: dict[str, Any]) -> ToolResult:
    return ToolResult()


def mcp_tool(name: str = "control_zwave_device") -> Tool:
    return Tool(
        name=name,
        description="",
        input_schema=SCHEMA,
        invoke=_noop,
        origin="mcp:x",
        rename_arguments=True,
    )


NORMALIZER = Normalizer(
    {
        "control_zwave_device": {
            "device_name": "deviceName",
            "command": "action",
            "brightness": "level",
        }
    }
)


@pytest.mark.parametrize(
    ("snake", "camel"),
    [("device_name", "deviceName"), ("a_b_c", "aBC"), ("x__y", "xY"), ("plain", "plain")],
)
def test_snake_to_camel(snake: str, camel: str) -> None:
    assert snake_to_camel(snake) == camel


def test_static_map_renames_keys_not_values() -> None:
    args, report = NORMALIZER.arguments(
        mcp_tool(), {"device_name": "device_name", "command": "on", "brightness": 5}
    )
    assert args == {"deviceName": "device_name", "action": "on", "level": 5}
    assert [(e.from_, e.to, e.rule) for e in report] == [
        ("device_name", "deviceName", "static_map"),
        ("command", "action", "static_map"),
        ("brightness", "level", "static_map"),
    ]
    assert report[0].path == "arguments.device_name"


def test_snake_to_camel_only_when_the_schema_declares_it() -> None:
    tool = mcp_tool("other_tool")
    args, report = NORMALIZER.arguments(
        tool, {"device_name": "a", "unknown_key": 1, "room": "k", "Level": 2}
    )
    assert args == {"deviceName": "a", "unknown_key": 1, "room": "k", "Level": 2}
    assert [(e.from_, e.to, e.rule) for e in report] == [
        ("device_name", "deviceName", "snake_to_camel")
    ]


def test_idempotent() -> None:
    once, _ = NORMALIZER.arguments(mcp_tool(), {"device_name": "a", "command": "on"})
    twice, report = NORMALIZER.arguments(mcp_tool(), once)
    assert twice == once and report == []


def test_two_keys_for_one_property_are_refused() -> None:
    with pytest.raises(InvalidArguments) as caught:
        NORMALIZER.arguments(mcp_tool(), {"device_name": "a", "deviceName": "b"})
    assert caught.value.details["property"] == "deviceName"


def test_local_tools_are_not_renamed() -> None:
    local = Tool(name="control_zwave_device", description="", input_schema=SCHEMA, invoke=_noop)
    args, report = NORMALIZER.arguments(local, {"device_name": "a"})
    assert args == {"device_name": "a"} and report == []
