"""Backends still starting (the MCP servers at start-up), as requests wait for them.

A call for a tool not known yet, and a tool list, both wait for servers still connecting,
within the request's own deadline and never longer: the one wait is `startup_settled`.
What a list still lacks then, its `pending` says (`pending_servers`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from toolbus.wire.contracts import PendingServer


class Startup(Protocol):
    """Backends that may still be registering tools (the MCP servers at start-up)."""

    def unsettled(self) -> list[str]: ...

    def states(self) -> dict[str, str]: ...

    async def wait_settled(self) -> None: ...


async def startup_settled(startup: Startup, deadline_s: float) -> bool:
    """Until every backend has settled (ready, or its start-up attempts spent); False if
    `deadline_s` passed first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline_s):
            await startup.wait_settled()
            return True
    return False


def pending_servers(startup: Startup) -> list[PendingServer]:
    """The servers not `ready` now, with their state: what a tool list may lack."""
    return [
        PendingServer.model_validate({"server": name, "state": state})
        for name, state in startup.states().items()
        if state != "ready"
    ]
