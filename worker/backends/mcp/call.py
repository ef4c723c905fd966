"""One tool's calls: the plan made once when its server lists it, and one call on a session.

What every call of a tool needs and that is the same for each (its name on the server,
the slots bounding its calls in flight, its span's name and attributes) is worked out
once, when the tool is listed (`CallPlan`), never per call. A call is one direct await
of the SDK's `call_tool` on the server's open session: no task of its own. Its CLIENT
span is made only when the span it runs under records: with tracing off, or the call's
trace not sampled, a child span would record nothing and only cost the call its making.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult
from opentelemetry import trace

from toolbus.backends.mcp.convert import call_error, describe
from toolbus.backends.mcp.session import Session
from toolbus.errors import Unavailable

_tracer = trace.get_tracer("toolbus.mcp")

TRANSPORT_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError)


@dataclass(frozen=True, slots=True)
class CallPlan:
    """Everything a call of one listed tool needs that is the same for every call."""

    server: str
    remote_name: str  # as the server lists it (the registry may know it sanitized)
    limit: int
    slots: asyncio.Semaphore  # the tool's own, or the server's, shared by its tools
    span_name: str
    span_attributes: Mapping[str, Any]


def call_plan(
    server: str,
    remote_name: str,
    slots: tuple[int, asyncio.Semaphore],
    server_span_attributes: Mapping[str, Any],
) -> CallPlan:
    limit, semaphore = slots
    return CallPlan(
        server=server,
        remote_name=remote_name,
        limit=limit,
        slots=semaphore,
        span_name=f"tools/call {remote_name}",
        span_attributes={**server_span_attributes, "gen_ai.tool.name": remote_name},
    )


async def send(current: Session, plan: CallPlan, arguments: dict[str, Any]) -> CallToolResult:
    """`tools/call` on the session; a failure as the caller's error (the session ended if
    the connection went)."""
    try:
        if not trace.get_current_span().is_recording():
            return await current.session.call_tool(plan.remote_name, arguments)
        with _tracer.start_as_current_span(
            plan.span_name, kind=trace.SpanKind.CLIENT, attributes=plan.span_attributes
        ):
            return await current.session.call_tool(plan.remote_name, arguments)
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            current.end("the connection closed")
        raise call_error(exc, plan.server) from exc
    except TRANSPORT_ERRORS as exc:
        current.end(describe(exc))
        raise Unavailable(
            f"MCP server {plan.server} is unreachable: {describe(exc)}", server=plan.server
        ) from exc
