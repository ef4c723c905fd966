"""A streamable-HTTP MCP server: our own HTTP client, and a session over it.

The client is ours, not the SDK's helper (`mcp.shared._httpx_utils`, a private module):
the same defaults the SDK documents for its transports (30 s, 300 s to read a held-open
response stream), built with `httpx2`, the HTTP library the SDK itself uses.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx2
from mcp import ClientSession
from mcp.client.session import MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client

from toolbus.backends.mcp.asking import Asking, session_of
from toolbus.config import McpServerConfig

TIMEOUT_S = 30.0
STREAM_READ_TIMEOUT_S = 300.0  # a server may hold a response stream open


async def open_http(
    stack: AsyncExitStack,
    config: McpServerConfig,
    message_handler: MessageHandlerFnT,
    asking: Asking | None = None,
) -> ClientSession:
    """Open a session to the server at `config.url`; it closes with `stack`."""
    assert config.url is not None
    # The SDK leaves a client it was given open: the stack closes ours.
    http = await stack.enter_async_context(
        httpx2.AsyncClient(
            headers=config.headers or None,
            timeout=httpx2.Timeout(TIMEOUT_S, read=STREAM_READ_TIMEOUT_S),
        )
    )
    read, write = await stack.enter_async_context(
        streamable_http_client(config.url, http_client=http)
    )
    return await stack.enter_async_context(session_of(read, write, message_handler, asking))
