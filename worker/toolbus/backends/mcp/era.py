"""Which MCP protocol a session speaks, and what differs between the two eras.

Servers of the handshake era (up to 2025-11-25) open with `initialize`, keep a session,
answer `ping` and send `notifications/tools/list_changed` on it. Servers of the modern
era (2026-07-28) are stateless: the client asks `server/discover`, stamps its version
and identity in every request's `_meta`, there is no `ping`, and a list change reaches
only a client holding a `subscriptions/listen` stream open.

`negotiate` is the SDK's own `mode="auto"` policy (`mcp.Client` runs the same function):
discover at the newest modern version, fall back to `initialize` on anything that is not
positive evidence of a modern server. toolbus builds its `ClientSession`s over transports
of its own (`stdio`, `http`), so it cannot use `mcp.Client`; the policy lives in the SDK's
`_probe` module, imported here and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AsyncExitStack

from mcp import ClientSession
from mcp.client._probe import negotiate_auto
from mcp.client.subscriptions import Subscription, SubscriptionLost, listen
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolbus.backends.mcp.convert import stand_in

log = logging.getLogger("toolbus.mcp")


async def negotiate(session: ClientSession) -> str:
    """Open the session at the newest version both sides speak; that version."""
    await negotiate_auto(session)
    version = session.protocol_version
    assert version is not None  # negotiate_auto returns only once one is adopted
    return version


def is_modern(session: ClientSession) -> bool:
    return session.protocol_version in MODERN_PROTOCOL_VERSIONS


async def probe(session: ClientSession) -> None:
    """A request the server answers at once, to tell that it is there: `ping` before
    2026-07-28, where it is gone; `server/discover` (stateless, cheap) from then on."""
    if is_modern(session):
        version = session.protocol_version
        assert version is not None
        await session.send_discover(version)
    else:
        await session.send_ping()


async def listen_for_tool_changes(
    stack: AsyncExitStack, session: ClientSession, server: str
) -> Subscription | None:
    """On a modern session whose server lists tool changes, the `subscriptions/listen`
    stream that carries them, open until `stack` closes (None otherwise: a handshake-era
    server sends `notifications/tools/list_changed` on the session itself).

    A server that refuses the stream with an error answer is there, and its tools work:
    the session opens without it (no list change reaches the worker until the next
    session), rather than failing, and being retried, for a stream it was never to have.
    Only the SDK's account of a failed exchange (`convert.stand_in`) fails the opening."""
    if not is_modern(session):
        return None
    capabilities = session.server_capabilities
    tools = capabilities.tools if capabilities is not None else None
    if tools is None or not tools.list_changed:
        return None
    try:
        subscription = await stack.enter_async_context(listen(session, tools_list_changed=True))
    except MCPError as exc:
        if stand_in(exc):
            raise
        log.info(
            "mcp server refused subscriptions/listen",
            extra={"server": server, "mcp_code": exc.code},
        )
        return None
    if not subscription.honored.tools_list_changed:
        return None  # the server declined: nothing will come
    return subscription


async def follow(subscription: Subscription, changed: Callable[[], None]) -> str:
    """Call `changed` for each tool list change on the stream until it ends; why it ended.

    The stream has no replay: a client that lost it must listen again and re-list, which
    a new session does (the holder ends this one on a lost stream)."""
    try:
        async for _event in subscription:
            changed()
    except SubscriptionLost:
        return "the subscriptions/listen stream was lost"
    return "the server closed the subscriptions/listen stream"
