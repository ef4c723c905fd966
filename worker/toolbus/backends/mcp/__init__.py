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

from toolbus.backends.mcp.backend import McpBackend
from toolbus.backends.mcp.server import McpServer, ServerState

__all__ = ["McpBackend", "McpServer", "ServerState"]
