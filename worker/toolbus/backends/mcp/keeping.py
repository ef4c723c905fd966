"""Keeping one open MCP session: re-listing tools when the server says they changed, and
checking an HTTP server's health, until the session ends or the worker stops.

A handshake-era server says its tools changed on the session itself
(`notifications/tools/list_changed`, heard by the server's message handler); a
2026-07-28 server says so only on a `subscriptions/listen` stream, followed here
(`era.follow`) for as long as the session lasts. A lost stream ends the session: it has
no replay, and a new session listens again and lists the tools afresh.

Health: `era.probe`, every `health_interval_s`, over HTTP only (a stdio session ends the
moment its process does). A server that answers it with an error is there
(`call.unanswered`): only the transport's failures end the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from mcp.shared.exceptions import MCPError

from toolbus.backends.mcp.call import TRANSPORT_ERRORS, unanswered
from toolbus.backends.mcp.convert import describe
from toolbus.backends.mcp.era import follow
from toolbus.backends.mcp.listing import ToolListing
from toolbus.backends.mcp.session import Session, first_of, list_tools

log = logging.getLogger("toolbus.mcp")


async def keep(
    current: Session,
    tools: ToolListing,
    *,
    server: str,
    stop: asyncio.Event,
    health_s: float,
    timeout_s: float,
) -> None:
    """Serve through `current` until it ends or `stop` is set (`health_s`: math.inf for none)."""
    following = _follow(current, tools)
    try:
        next_ping = time.monotonic() + health_s
        while not stop.is_set() and not current.ended.is_set():
            relist_in = tools.due_in()
            wake_in = min(
                math.inf if relist_in is None else relist_in, next_ping - time.monotonic()
            )
            waits = [stop.wait(), current.ended.wait()]
            if relist_in is None:  # one is already asked for: it waits its turn, not the event
                waits.append(tools.asked.wait())
            await first_of(waits, None if wake_in == math.inf else max(0.0, wake_in))
            if stop.is_set() or current.ended.is_set():
                break
            if tools.due_in() == 0.0:
                await _relist(current, tools, server, timeout_s)
            if time.monotonic() >= next_ping:
                await _ping(current, server, timeout_s)
                next_ping = time.monotonic() + health_s
    finally:
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following


def _follow(current: Session, tools: ToolListing) -> asyncio.Task[None] | None:
    """The task following the session's `subscriptions/listen` stream, if it has one."""
    if current.subscription is None:
        return None
    subscription = current.subscription

    async def run() -> None:
        why = await follow(subscription, tools.ask)
        current.end(why)

    return asyncio.create_task(run(), name="mcp-listen")


async def _relist(current: Session, tools: ToolListing, server: str, timeout_s: float) -> None:
    tools.starting()
    try:
        async with asyncio.timeout(timeout_s):
            listed = await list_tools(current.session)
    except (MCPError, TimeoutError, *TRANSPORT_ERRORS) as exc:
        current.end(f"re-listing tools failed: {describe(exc)}")
        return
    added, removed = tools.sync(listed)
    if added or removed:
        log.info(
            "mcp tools changed",
            extra={"server": server, "added": added, "removed": removed},
        )


async def _ping(current: Session, server: str, timeout_s: float) -> None:
    why = await unanswered(current, timeout_s, server)
    if why is not None:
        current.end(f"health check failed: {why}")
