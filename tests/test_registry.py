"""Registry: duplicate names, origins, definitions."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from toolbus.contracts import ToolResult
from toolbus.errors import UnknownTool
from toolbus.registry import Registry, Tool
from toolbus.validate import _known_schema_problem


def make(name: str, origin: str = "local", schema: dict[str, Any] | None = None) -> Tool:
    async def invoke(arguments: dict[str, Any]) -> ToolResult:
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
    assert (await registry.get("lamp").invoke({})).text == "mcp:a"
    assert len(registry) == 1


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
