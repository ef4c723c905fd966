"""Tool names (registry.py): spellings, aliases, servers, sanitizing and hidden tools."""

from __future__ import annotations

import pytest

from tests.support.normalize_cases import echo_arguments, mcp_tool, registry_with
from toolbus.config import ToolSettings
from toolbus.tools.registry import Tool, sanitize_name
from toolbus.wire.errors import UnknownTool


@pytest.mark.parametrize(
    "name",
    [
        "control_zwave_device",
        "ControlZwaveDevice",
        "control-zwave-device",
        "controlzwavedevice",
        "CONTROL ZWAVE DEVICE",
        "zwave.control_zwave_device",
        "zwave__control_zwave_device",
        "Zwave",
    ],
)
def test_tool_name_spellings(name: str) -> None:
    registry = registry_with(mcp_tool(), aliases={"zwave": "control_zwave_device"})
    resolved = registry.resolve(name)
    assert resolved.name == "control_zwave_device"
    rules = [e.rule for e in resolved.report]
    assert rules in ([], ["tool_spelling"], ["alias"])


def test_ambiguous_names_are_refused_with_candidates() -> None:
    registry = registry_with(mcp_tool("get_data"), mcp_tool("getData"))
    assert registry.resolve("getData").name == "getData"  # exact still wins
    with pytest.raises(UnknownTool) as caught:
        registry.resolve("GET-DATA")
    assert caught.value.details["candidates"] == ["getData", "get_data"]


def test_same_tool_on_two_servers() -> None:
    first = Tool(
        name="search",
        description="",
        input_schema={},
        invoke=echo_arguments,
        origin="mcp:a",
        server="a",
        rank=0,
    )
    second = Tool(
        name="search",
        description="",
        input_schema={},
        invoke=echo_arguments,
        origin="mcp:b",
        server="b",
        rank=1,
    )
    registry = registry_with(second, first)  # registration order must not matter
    assert registry.resolve("search").tool is first
    assert (
        registry.resolve("b.search").tool is second and registry.resolve("b__search").tool is second
    )
    assert registry.names() == ["b.search", "search"]
    registry.unregister_origin("mcp:a")
    assert registry.resolve("search").tool is second


def test_unknown_alias_targets_are_reported() -> None:
    registry = registry_with(
        mcp_tool(), aliases={"MindMap": "create_mindmap", "lights": "control_zwave_device"}
    )
    assert registry.unknown_aliases() == {"mindmap": "create_mindmap"}


def test_sanitized_names() -> None:
    assert sanitize_name("ok_name-1.2/x") == "ok_name-1.2/x"
    odd = sanitize_name("weird name!")
    assert (
        odd != "weird name!"
        and odd.startswith("weird_name")
        and sanitize_name("weird name!") == odd
    )
    assert len(sanitize_name("x" * 100)) <= 64


def test_hidden_tools_appear_in_no_list() -> None:
    hidden = Tool(
        name="reboot",
        description="",
        input_schema={},
        invoke=echo_arguments,
        settings=ToolSettings(model_invocable=False),
    )
    registry = registry_with(hidden, mcp_tool())
    assert [d.name for d in registry.definitions()] == ["control_zwave_device"]
    assert registry.resolve("reboot").tool is hidden  # still callable by automation
