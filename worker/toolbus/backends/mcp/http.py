"""A streamable-HTTP MCP server: our own HTTP client, and a session over it.

The client is ours, not the SDK's helper (`mcp.shared._httpx_utils`, a private module):
the same defaults the SDK documents for its transports (30 s, 300 s to read a held-open
response stream), built with `httpx2`, the HTTP library the SDK itself uses.

An HTTP 404 to a request that carries the session's id is the transport's word that the
server no longer knows the session (it restarted, or expired it): the session ends
(`on_end`) and a new one is opened, whatever JSON-RPC error the body holds (the SDK
hands a server's body on as an ordinary error answer, which alone would keep the session).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack

import httpx2
from mcp import ClientSession
from mcp.client.session import MessageHandlerFnT
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client

from toolbus.backends.mcp.asking import Asking, session_of
from toolbus.config import McpServerConfig

TIMEOUT_S = 30.0
STREAM_READ_TIMEOUT_S = 300.0  # a server may hold a response stream open


async def open_http(
    stack: AsyncExitStack,
    config: McpServerConfig,
    message_handler: MessageHandlerFnT,
    asking: Asking | None = None,
    on_end: Callable[[str], None] | None = None,
) -> ClientSession:
    """Open a session to the server at `config.url`; it closes with `stack`."""
    assert config.url is not None

    async def forgotten(response: httpx2.Response) -> None:
        session_bound = MCP_SESSION_ID in response.request.headers
        if on_end is not None and response.status_code == 404 and session_bound:
            on_end("the server no longer knows the session (HTTP 404)")

    # The SDK leaves a client it was given open: the stack closes ours.
    http = await stack.enter_async_context(
        httpx2.AsyncClient(
            headers=config.headers or None,
            timeout=httpx2.Timeout(TIMEOUT_S, read=STREAM_READ_TIMEOUT_S),
            event_hooks={"response": [forgotten]},
        )
    )
    read, write = await stack.enter_async_context(
        streamable_http_client(config.url, http_client=http)
    )
    return await stack.enter_async_context(session_of(read, write, message_handler, asking))
