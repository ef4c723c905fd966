"""MCP backend: tools on MCP servers, over long-lived `mcp` SDK sessions.

The only package that imports `mcp`:

    backend  the facade: every configured server, started and stopped together
    server   one server's state machine, retries, session and calls
    listing  one server's tools as registered, and when to list them again
    call     one tool's calls: the plan made when it is listed, one call on a session
    stdio    a stdio server's process, and bounded pipes to it (our own transport)
    stderr   a stdio server's stderr: bounded lines to the log, a tail for reports
    lines    bounded line splitting, and whose answer an oversized line is
    environment  what a stdio server's process inherits
    http     a streamable-HTTP server's client
    convert  the SDK's types to ours (tools, results, failures)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolbus.backends.mcp.backend import McpBackend
    from toolbus.backends.mcp.server import McpServer, ServerState

__all__ = ["McpBackend", "McpServer", "ServerState"]


def __getattr__(name: str) -> object:
    """Each name loaded when first asked for: the mcp SDK (which `server` imports) takes
    about a second, and a worker with no MCP server never needs it."""
    if name == "McpBackend":
        from toolbus.backends.mcp.backend import McpBackend  # noqa: PLC0415 -- see above

        return McpBackend
    if name in ("McpServer", "ServerState"):
        from toolbus.backends.mcp import server  # noqa: PLC0415 -- see above

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
