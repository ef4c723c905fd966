"""Registry: duplicate names, origins, definitions."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.registry import Registry, Tool
from toolbus.tools.validate import _known_schema_problem
from toolbus.wire.contracts import ToolResult
from toolbus.wire.errors import UnknownTool


def make(name: str, origin: str = "local", schema: dict[str, Any] | None = None) -> Tool:
    async def invoke(arguments: dict[str, Any], context: CallContext = DETACHED) -> ToolResult:
        return ToolResult(text=origin)

    return Tool(
        name=name,
        description=origin,
        input_schema=schema or {"type": "object"},
        invoke=invoke,
        origin=origin,
    )


async def test_registering_twice_warns_and_the_later_wins(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()
    registry.register(make("lamp", "local"))
    with caplog.at_level(logging.WARNING, logger="toolbus.registry"):
        registry.register(make("lamp", "mcp:a"))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert (await registry.get("lamp").invoke({}, DETACHED)).text == "mcp:a"
    assert len(registry) == 1


def served(name: str, server: str, rank: int = 0) -> Tool:
    """A tool as an MCP server's backend registers it."""

    async def invoke(arguments: dict[str, Any], context: CallContext = DETACHED) -> ToolResult:
        return ToolResult(text=server)

    return Tool(
        name=name,
        description=server,
        input_schema={"type": "object"},
        invoke=invoke,
        origin=f"mcp:{server}",
        server=server,
        rank=rank,
    )


@pytest.mark.parametrize("local_first", [True, False], ids=["local-first", "mcp-first"])
async def test_a_local_tool_keeps_its_bare_name_against_an_mcp_tool(
    caplog: pytest.LogCaptureFixture, local_first: bool
) -> None:
    registry = Registry()
    local, remote = make("lamp"), served("lamp", "devices")
    with caplog.at_level(logging.WARNING, logger="toolbus.registry"):
        for tool in (local, remote) if local_first else (remote, local):
            registry.register(tool)
    assert (await registry.get("lamp").invoke({}, DETACHED)).text == "local"
    for qualified in ("devices.lamp", "devices__lamp", "devices/lamp"):
        assert (await registry.get(qualified).invoke({}, DETACHED)).text == "devices"
    assert registry.names() == ["devices.lamp", "lamp"]
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    assert "local" in warning.getMessage() and "devices" in warning.getMessage()


async def test_a_collision_is_logged_once_and_survives_reconnects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    registry.register(make("lamp"))
    with caplog.at_level(logging.WARNING, logger="toolbus.registry"):
        for _ in range(3):  # every reconnect re-lists the server's tools
            registry.replace_origin("mcp:devices", [served("lamp", "devices")])
    assert len(caplog.records) == 1
    registry.unregister_origin("mcp:devices")  # the server goes away: the local tool stays
    assert (await registry.get("lamp").invoke({}, DETACHED)).text == "local"
    assert registry.names() == ["lamp"]


async def test_among_mcp_servers_the_first_listed_owns_the_bare_name() -> None:
    registry = Registry()
    registry.register_all([served("lamp", "second", rank=1), served("lamp", "first", rank=0)])
    assert (await registry.get("lamp").invoke({}, DETACHED)).text == "first"
    assert registry.names() == ["lamp", "second.lamp"]
    registry.register(make("lamp"))  # a local tool beats both
    assert registry.names() == ["first.lamp", "lamp", "second.lamp"]
    assert (await registry.get("lamp").invoke({}, DETACHED)).text == "local"


def test_unregister_origin_and_definitions() -> None:
    registry = Registry()
    registry.register_all([make("a", "mcp:x"), make("b", "mcp:x"), make("c")])
    assert registry.unregister_origin("mcp:x") == ["a", "b"]
    assert [d.name for d in registry.definitions()] == ["c"]
    with pytest.raises(UnknownTool):
        registry.get("a")


def test_invalid_schema_is_not_enforced(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="toolbus.validate"):
        tool = make("odd", schema={"type": "object", "properties": {"x": {"type": 12}}})
    assert not tool.validator.enforced
    assert caplog.records


def test_the_meta_schema_check_runs_once_per_schema() -> None:
    """Re-listed MCP tools (every reconnect) must not pay the pure-Python check again."""
    schema = {"type": "object", "properties": {"only_here_once": {"type": "string"}}}
    make("first", schema=schema)
    before = _known_schema_problem.cache_info()
    make("second", schema=dict(schema))
    after = _known_schema_problem.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)
