"""One tool's calls: the plan made once when its server lists it, and one call on a session.

What every call of a tool needs and that is the same for each (its name on the server,
the slots bounding its calls in flight, its span's name and attributes) is worked out
once, when the tool is listed (`CallPlan`), never per call. A call is one direct await
of the SDK's `call_tool` on the server's open session: no task of its own.

Tracing: the call's CLIENT span (`tools/call {tool}`) is made with the worker's own
tracer whenever the span it runs under records, so it lands where the message's spans
do. Whenever the call carries a trace (recorded or not: a caller's context passes
through a worker that records nothing), its W3C headers go in the request's `_meta`,
written here: the SDK's own injection goes through the global propagator, which
`OTEL_PROPAGATORS` may have made something else, and writes no `baggage` unless it is
configured to. The SDK's span beneath ours, when it records, then writes its own id over
`traceparent` (with the default propagators). An untraced call (no span, no caller's
context) pays one check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, RequestParamsMeta
from opentelemetry import trace

from toolbus.backends.mcp.convert import call_error, describe
from toolbus.backends.mcp.session import Session
from toolbus.observability.propagation import inject_headers
from toolbus.observability.spans import step_span
from toolbus.wire.errors import Unavailable

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


async def send(
    current: Session, plan: CallPlan, arguments: dict[str, Any], tracer: trace.Tracer
) -> CallToolResult:
    """`tools/call` on the session, in a CLIENT span of `tracer` when the call is recorded;
    a failure as the caller's error (the session ended if the connection went)."""
    under = trace.get_current_span()
    if not under.is_recording():
        # Not recorded: a caller's context still passes on; without one, nothing does.
        meta = _meta() if under.get_span_context().is_valid else None
        return await _call(current, plan, arguments, meta)
    # The span records the refusal's code, never its text or stack (`step_span`).
    with step_span(
        tracer, plan.span_name, kind=trace.SpanKind.CLIENT, attributes=plan.span_attributes
    ):
        return await _call(current, plan, arguments, _meta())


async def _call(
    current: Session, plan: CallPlan, arguments: dict[str, Any], meta: RequestParamsMeta | None
) -> CallToolResult:
    try:
        return await current.session.call_tool(plan.remote_name, arguments, meta=meta)
    except MCPError as exc:
        if exc.code == CONNECTION_CLOSED:
            current.end("the connection closed")
        raise call_error(exc, plan.server) from exc
    except TRANSPORT_ERRORS as exc:
        current.end(describe(exc))
        raise Unavailable(
            f"MCP server {plan.server} is unreachable: {describe(exc)}", server=plan.server
        ) from exc


def _meta() -> RequestParamsMeta:
    """The current trace context and baggage as the request's `_meta` (SEP-414)."""
    return cast(RequestParamsMeta, dict(inject_headers()))
