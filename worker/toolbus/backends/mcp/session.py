"""One open MCP session: the SDK's `ClientSession`, its tools, and how it ends.

A session is opened, held and closed by one task (anyio's cancel scopes require it);
anything that sees it fail (a call, a ping, the process exiting) marks it ended with a
reason, and its holder closes it.

Whether its connection is over is the transport's word, never an error code's
(`call.failure`): the stdio transport ends the session itself, before the SDK can see
the pipes close; over HTTP, where the SDK's transport reports a response stream it lost
with the same code a server may answer with, only a ping can tell (`ping_to_tell_s`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from mcp import ClientSession
from mcp.client.subscriptions import Subscription
from mcp_types import PaginatedRequestParams
from mcp_types import Tool as ListedTool

from toolbus.backends.mcp.asking import Asking
from toolbus.backends.mcp.convert import describe
from toolbus.backends.mcp.deadlines import CLOSE_DEADLINE_S

log = logging.getLogger("toolbus.mcp")


@dataclass
class Ending:
    """How a session ends: once, with the first reason anyone gives.

    Made before the session opens, so that the transport can end it (a process that
    exits during start-up) before there is a `Session` to end. `listener` hears the
    reason at once, in the task that ends it (the server's state must not lag).
    """

    event: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = "the session ended"
    listener: Callable[[str], None] | None = None

    def end(self, why: str) -> None:
        if not self.event.is_set():
            self.why = why
            self.event.set()
            if self.listener is not None:
                self.listener(why)


@dataclass
class Session:
    """An open session, the tools it listed, and the stack that closes it.

    `ping_to_tell_s`: None when the transport ends the session the moment its connection
    ends (stdio), so that an open session's connection is up; else how long a ping may
    take to show that it is (HTTP). `subscription`: the `subscriptions/listen` stream a
    2026-07-28 server tells its tool list changes on (`era`), else None.
    """

    session: ClientSession
    tools: list[ListedTool]
    stack: AsyncExitStack
    ending: Ending = field(default_factory=Ending)
    ping_to_tell_s: float | None = None
    asking: Asking | None = None  # its questions' way to the callers (backends/mcp/asking.py)
    subscription: Subscription | None = None
    probe_refused: bool = False  # the server answered a probe with an error (told once)

    @property
    def ended(self) -> asyncio.Event:
        return self.ending.event

    @property
    def why(self) -> str:
        return self.ending.why

    def end(self, why: str) -> None:
        """Mark the session over; the first reason given is the one reported."""
        self.ending.end(why)

    async def close(self) -> None:
        """Close the transport (and stop a stdio process) within its deadline."""
        try:
            async with asyncio.timeout(CLOSE_DEADLINE_S):
                await self.stack.aclose()
        except Exception as exc:
            log.debug("closing an MCP session: %s", describe(exc))


async def list_tools(session: ClientSession) -> list[ListedTool]:
    """Every tool the server lists, all pages."""
    tools: list[ListedTool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(
            params=PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def first_of(waits: list[Any], timeout_s: float | None) -> None:
    """Until the first of `waits` (coroutines) is done, or `timeout_s` passes."""
    futures = {asyncio.ensure_future(w) for w in waits}
    try:
        await asyncio.wait(futures, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
