"""One server's tools: what it listed, registered with their call plans; when to list again.

A server says its tools changed with `notifications/tools/list_changed`, and nothing
stops it from saying so in a loop: one that did made the worker re-list 224 times a
second (74% of a core, an INFO line each). So re-listing is paced. The server's task
runs one re-list at a time; notifications that come while one runs, or while the next
waits its turn, fold into that one next re-list; and two re-lists start at least
`RELIST_INTERVAL_S` apart. A listing the same as the last one touches nothing (the
registry, and the tables built from it, stay as they are), and only a change to the
set of tools is logged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from mcp_types import Tool as ListedTool

from toolbus.backends.mcp.call import CallPlan, call_plan
from toolbus.backends.mcp.convert import to_tool
from toolbus.config import ToolSettings, tool_settings
from toolbus.tools.context import CallContext
from toolbus.tools.registry import Registry, Tool, sanitize_name
from toolbus.wire.contracts import ToolResult

log = logging.getLogger("toolbus.mcp")

RELIST_INTERVAL_S = 1.0
"""The least time between the starts of two re-lists of one server's tools."""

Invoke = Callable[[CallPlan, dict[str, Any], CallContext], Awaitable[ToolResult]]


class ToolListing:
    """The tools one server listed last, as registered tools, and its pending re-list.

    Args:
        server: the server's name; `origin` is its tools' origin in the registry.
        rank: configuration order (the first listed owns a shared bare name).
        slots: the server's own limit and semaphore, for tools without a limit of their own.
        span_attributes: the server's, for each call's CLIENT span.
        invoke: runs one call with a tool's plan (the server's `_call`).
    """

    def __init__(
        self,
        server: str,
        origin: str,
        *,
        rank: int,
        registry: Registry,
        tool_settings: Mapping[str, ToolSettings],
        slots: tuple[int, asyncio.Semaphore],
        span_attributes: Mapping[str, Any],
        invoke: Invoke,
    ) -> None:
        self.server, self.origin, self.rank = server, origin, rank
        self.tool_names: list[str] = []
        self.plans: dict[str, CallPlan] = {}  # by the tool's name on the server
        self.asked = asyncio.Event()  # a re-list is wanted (the server said its tools changed)
        self._registry = registry
        self._tool_settings = tool_settings
        self._slots = slots
        self._span_attributes = span_attributes
        self._invoke = invoke
        self._listed: list[ListedTool] | None = None
        self._last_start = -math.inf

    def ask(self) -> None:
        """The server said its tools changed: re-list once it is time (never twice queued)."""
        self.asked.set()

    def due_in(self) -> float | None:
        """Seconds until the asked-for re-list may start (0: now); None when none is asked."""
        if not self.asked.is_set():
            return None
        return max(0.0, self._last_start + RELIST_INTERVAL_S - time.monotonic())

    def starting(self) -> None:
        """A listing starts now: what the server says from here on asks for the next one."""
        self.asked.clear()
        self._last_start = time.monotonic()

    def sync(self, listed: list[ListedTool]) -> tuple[list[str], list[str]]:
        """Register what the server listed, in place of what it listed before; the names
        added and removed (none, and nothing touched, when the listing is the same)."""
        if listed == self._listed:
            return [], []
        plans: dict[str, CallPlan] = {}
        tools = [self._tool(t, plans) for t in listed]
        self.plans, self._listed = plans, list(listed)
        self.tool_names = [t.name for t in tools]
        return self._registry.replace_origin(self.origin, tools)

    def limit(self, remote_name: str) -> int:
        """Calls to this tool that may run at once: its own limit, else the server's."""
        planned = self.plans.get(remote_name)
        return planned.limit if planned else self._slots[0]

    def plan(self, remote_name: str) -> CallPlan:
        """The plan of a listed tool; one with the server's limit for any other name."""
        return self.plans.get(remote_name) or call_plan(
            self.server, remote_name, self._slots, self._span_attributes
        )

    def _tool(self, listed: ListedTool, plans: dict[str, CallPlan]) -> Tool:
        remote_name = listed.name
        name = sanitize_name(remote_name)
        if name != remote_name:
            log.warning(
                "MCP server %s announced tool %r: registered as %s", self.server, remote_name, name
            )
        settings = tool_settings(self._tool_settings, name, self.server)
        limit = settings.max_in_flight
        slots = (limit, asyncio.Semaphore(limit)) if limit else self._slots
        execution = listed.execution
        required = execution is not None and execution.task_support == "required"
        plans[remote_name] = planned = call_plan(
            self.server, remote_name, slots, self._span_attributes, as_task=required
        )
        return to_tool(
            listed,
            name,
            server=self.server,
            rank=self.rank,
            settings=settings,
            invoke=partial(self._invoke, planned),  # no wrapper: one coroutine per call, not two
        )
