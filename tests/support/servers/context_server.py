"""An MCP test server that reports the trace context each call reached it with, over stdio.

`trace_context` answers with the W3C headers of the request's `_meta` and the span
context the SDK continued from them (this server records no spans, so the current span
is the caller's, as the SDK extracted it). The SDK parents its span from `_meta` but
does not make the baggage there current: a server reads baggage from `_meta`.
`refuse` answers every call with a JSON-RPC error that quotes its argument.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS
from opentelemetry import trace

server = MCPServer("toolbus-test-context")

W3C_HEADERS = ("traceparent", "tracestate", "baggage")


@server.tool()
def trace_context(ctx: Context) -> dict[str, Any]:
    """The trace context and baggage this call arrived with."""
    meta: dict[str, Any] = dict(ctx.request_context.meta or {})
    current = trace.get_current_span().get_span_context()
    return {
        "meta": {key: meta[key] for key in W3C_HEADERS if key in meta},
        "trace_id": format(current.trace_id, "032x") if current.is_valid else None,
        "parent_span_id": format(current.span_id, "016x") if current.is_valid else None,
    }


@server.tool()
def refuse(value: str) -> str:
    """Refuses every call with a JSON-RPC error quoting the value (as many servers do)."""
    raise MCPError(INVALID_PARAMS, f"{value!r} is not acceptable")


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server.run("stdio")
