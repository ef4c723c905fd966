"""One resolver for per-tool settings: with `create_ticket` and `snake.create_ticket` both
configured, every stage reads the same entry for the same tool.

Two real MCP servers (`snake` and `other`) run the same snake_case server, so both expose
`create_ticket`: `snake.create_ticket` gets the qualified entry, `other.create_ticket`
and a local `create_ticket` get the bare one. Each stage is checked by what it does
(deadline, static map, argument respelling, coercions, guards, listing, call limit),
not by reading the settings back. No broker: the executor runs the calls.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from toolbus.backends.local.functions import tool
from toolbus.backends.mcp import McpBackend
from toolbus.calls.call import Call
from toolbus.calls.execute import Executor, Outcome
from toolbus.config import Settings
from toolbus.wire.contracts import ErrorCode
from toolbus.worker.wiring import build_executor, build_registry

SNAKE_SERVER = {
    "command": sys.executable,
    "args": [str(Path(__file__).parents[1] / "support" / "servers" / "snake_server.py")],
}

# The two entries differ in every setting a stage reads.
QUALIFIED = {
    "timeout_s": 1.5,
    "max_in_flight": 2,
    "rename_arguments": False,
    "skip_coercions": ["all"],
    "model_invocable": False,
    "guards": {"max_string_length": 8},
}
BARE = {"timeout_s": 7.0, "max_in_flight": 5, "guards": {"max_string_length": 100}}


def settings() -> Settings:
    return Settings.model_validate(
        {
            "mcpServers": {"snake": SNAKE_SERVER, "other": SNAKE_SERVER},
            "tools": {"create_ticket": BARE, "snake.create_ticket": QUALIFIED},
            "argument_maps": {
                "create_ticket": {"heading": "ticket_title"},
                "snake.create_ticket": {"title": "ticket_title"},
            },
            "mcp": {"startup_base_delay_s": 0.05},
        }
    )


@pytest_asyncio.fixture(scope="module")
async def stages() -> AsyncIterator[tuple[Executor, McpBackend]]:
    config = settings()
    registry = build_registry([], config)
    async with McpBackend(config.mcp_servers, registry, config.tools, config.mcp) as backend:
        executor = build_executor(config, registry, startup=backend)
        async with asyncio.timeout(60):
            await backend.wait_settled()
        assert backend.states() == {"snake": "ready", "other": "ready"}
        yield executor, backend


async def run(executor: Executor, tool_name: str, arguments: dict[str, Any]) -> Outcome:
    return await executor.execute(
        Call(id="c1", tool=tool_name, arguments=arguments, topic="t", caller=None)
    )


def code(outcome: Outcome) -> ErrorCode | None:
    return None if outcome.error is None else outcome.error.code


TICKET = {"ticket_title": "Lamp", "assignee_name": "ana"}


async def test_deadline(stages: tuple[Executor, McpBackend]) -> None:
    executor, _ = stages
    call = Call(id="c", tool="x", arguments={}, topic="t")
    assert executor.deadline_s(call, executor.registry.get("snake.create_ticket")) == 1.5
    assert executor.deadline_s(call, executor.registry.get("other.create_ticket")) == 7.0


async def test_static_argument_map(stages: tuple[Executor, McpBackend]) -> None:
    executor, _ = stages
    title = {"assignee_name": "ana"}
    assert code(await run(executor, "snake.create_ticket", {**title, "title": "x"})) is None
    assert code(await run(executor, "other.create_ticket", {**title, "heading": "x"})) is None
    # Each map belongs to its own entry only.
    refused = await run(executor, "snake.create_ticket", {**title, "heading": "x"})
    assert code(refused) == ErrorCode.INVALID_ARGUMENTS


async def test_argument_respelling(stages: tuple[Executor, McpBackend]) -> None:
    executor, _ = stages
    camel = {"ticketTitle": "Lamp", "assigneeName": "ana"}
    assert code(await run(executor, "other.create_ticket", camel)) is None
    assert code(await run(executor, "snake.create_ticket", camel)) == ErrorCode.INVALID_ARGUMENTS


async def test_coercions(stages: tuple[Executor, McpBackend]) -> None:
    executor, _ = stages
    shouted = {**TICKET, "priority": "HIGH"}
    assert code(await run(executor, "other.create_ticket", shouted)) is None
    assert code(await run(executor, "snake.create_ticket", shouted)) == (
        ErrorCode.INVALID_ARGUMENTS
    )


async def test_guards(stages: tuple[Executor, McpBackend]) -> None:
    executor, _ = stages
    long_title = {**TICKET, "ticket_title": "Lamp is broken"}  # 14 characters
    assert code(await run(executor, "other.create_ticket", long_title)) is None
    assert code(await run(executor, "snake.create_ticket", long_title)) == (
        ErrorCode.INVALID_ARGUMENTS
    )


async def test_model_invocable(stages: tuple[Executor, McpBackend]) -> None:
    executor, _ = stages
    listed = {d.name for d in executor.registry.definitions()}  # what models are shown
    shown = executor.registry.shown_name
    assert shown(executor.registry.get("other.create_ticket")) in listed
    assert shown(executor.registry.get("snake.create_ticket")) not in listed


async def test_call_limit(stages: tuple[Executor, McpBackend]) -> None:
    _, backend = stages
    assert backend.servers["snake"].limit("create_ticket") == 2
    assert backend.servers["other"].limit("create_ticket") == 5


async def test_a_local_tool_gets_the_bare_entry() -> None:
    @tool
    async def create_ticket(ticket_title: str) -> str:
        """Local namesake of the MCP tools."""
        return ticket_title

    config = settings()
    executor = build_executor(config, build_registry([create_ticket], config))
    local = executor.registry.get("create_ticket")
    assert local.server is None
    call = Call(id="c", tool="create_ticket", arguments={}, topic="t")
    assert executor.deadline_s(call, local) == 7.0
    assert code(await run(executor, "create_ticket", {"ticket_title": "Lamp is broken"})) is None
    assert code(await run(executor, "create_ticket", {"heading": "Lamp"})) is None
