"""Serve an SDK `MCPServer` over stdio as a server of 2025-11-25 only.

The SDK's servers serve both protocol eras, each connection in the era the client's first
request opens (`server/discover` opens 2026-07-28). A server of 2025-11-25 knows no
`server/discover`: it answers "method not found", and a client falls back to `initialize`.
This answers it so before the SDK's loop sees it, so a test server pinned here is the
legacy era's (elicitation and sampling as server requests on the session, `ping`,
`notifications/tools/list_changed` on the session, tasks).

    if __name__ == "__main__":
        anyio.run(serve_legacy_only, server)
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError, JSONRPCRequest

METHOD_NOT_FOUND = -32601


async def serve_legacy_only(server: MCPServer[Any]) -> None:
    """Serve `server` on stdin/stdout until stdin ends, refusing `server/discover`."""
    async with stdio_server() as (read, write):
        inner_send, inner_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def sieve() -> None:
            async with inner_send:
                async for item in read:
                    message = item.message if isinstance(item, SessionMessage) else None
                    if isinstance(message, JSONRPCRequest) and message.method == "server/discover":
                        error = ErrorData(code=METHOD_NOT_FOUND, message="Method not found")
                        refusal = JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
                        await write.send(SessionMessage(refusal))
                        continue
                    await inner_send.send(item)

        lowlevel = server._lowlevel_server  # the loop `MCPServer.run` drives, on our streams
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sieve)
            await lowlevel.run(inner_read, write, lowlevel.create_initialization_options())
            tasks.cancel_scope.cancel()
