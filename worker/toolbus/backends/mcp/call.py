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
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, cast

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolResult,
    InputRequiredResult,
    InputResponses,
    RequestParamsMeta,
)
from opentelemetry import trace

from toolbus.backends.mcp.asking import responses, settle
from toolbus.backends.mcp.convert import SDK_LOST_RESPONSE, call_error, describe, stand_in
from toolbus.backends.mcp.era import probe
from toolbus.backends.mcp.session import Session
from toolbus.backends.mcp.tasks import call_as_task
from toolbus.observability.propagation import inject_headers
from toolbus.observability.spans import step_span
from toolbus.tools.context import CallContext
from toolbus.wire.errors import ToolbusError, Unavailable

log = logging.getLogger("toolbus.mcp")

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
    as_task: bool = False  # the server lists it `execution.taskSupport: required`


def call_plan(
    server: str,
    remote_name: str,
    slots: tuple[int, asyncio.Semaphore],
    server_span_attributes: Mapping[str, Any],
    *,
    as_task: bool = False,
) -> CallPlan:
    limit, semaphore = slots
    return CallPlan(
        as_task=as_task,
        server=server,
        remote_name=remote_name,
        limit=limit,
        slots=semaphore,
        span_name=f"tools/call {remote_name}",
        span_attributes={**server_span_attributes, "gen_ai.tool.name": remote_name},
    )


async def send(
    current: Session,
    plan: CallPlan,
    arguments: dict[str, Any],
    tracer: trace.Tracer,
    context: CallContext,
) -> CallToolResult:
    """`tools/call` on the session, in a CLIENT span of `tracer` when the call is recorded;
    a failure as the caller's error (the session ended if the connection went)."""
    under = trace.get_current_span()
    if not under.is_recording():
        # Not recorded: a caller's context still passes on; without one, nothing does.
        meta = _meta() if under.get_span_context().is_valid else None
        return await _call(current, plan, arguments, meta, context)
    # The span records the refusal's code, never its text or stack (`step_span`).
    with step_span(
        tracer, plan.span_name, kind=trace.SpanKind.CLIENT, attributes=plan.span_attributes
    ):
        return await _call(current, plan, arguments, _meta(), context)


async def _call(
    current: Session,
    plan: CallPlan,
    arguments: dict[str, Any],
    meta: RequestParamsMeta | None,
    context: CallContext,
) -> CallToolResult:
    relay = _Relay(context) if context.wants_progress else None
    try:
        # No read timeout for the SDK: a call's deadline is the executor's (a cancellation),
        # so the SDK's own REQUEST_TIMEOUT never happens and a -32001 is the server's answer.
        if plan.as_task:  # it runs only as a task: polled to its end (tasks.py)
            return await call_as_task(current, plan.remote_name, arguments, meta, context)
        # A progress callback only when the caller asked: with it the SDK sends a
        # `progressToken` (the request id), without it none.
        progress = relay.forward if relay is not None else None

        async def again(
            answers: InputResponses | None, state: str | None
        ) -> CallToolResult | InputRequiredResult:
            return await current.session.call_tool(
                plan.remote_name,
                arguments,
                progress_callback=progress,
                meta=meta,
                input_responses=answers,
                request_state=state,
                allow_input_required=True,  # a 2026-07-28 server's questions (asking.py)
            )

        resume = context.resume
        with _asked_through(current, context):
            first = await again(responses(resume), None if resume is None else resume.state)
            return await settle(first, again, context)
    except MCPError as exc:
        raise await failure(current, exc, plan.server) from exc
    except TRANSPORT_ERRORS as exc:
        current.end(describe(exc))
        raise Unavailable(
            f"MCP server {plan.server} is unreachable: {describe(exc)}", server=plan.server
        ) from exc
    finally:
        if relay is not None:
            relay.done = True


def _asked_through(current: Session, context: CallContext) -> AbstractContextManager[None]:
    """While the call is in flight, the session's questions may be for it (asking.py)."""
    if current.asking is None:
        return nullcontext()
    return current.asking.calling(current.session, context)


class _Relay:
    """A server's progress notifications for one call, on to the call's context.

    The SDK runs each callback as a task of its own, so two may run out of wire order:
    the body does not await before it hands the update on (asyncio starts the tasks in
    wire order, and each then runs to its end). A notification whose task runs after
    `call_tool` returned is dropped (the reply may be out already), and so is one that
    does not increase (MCP: progress MUST increase)."""

    __slots__ = ("context", "done", "last")

    def __init__(self, context: CallContext) -> None:
        self.context = context
        self.done = False
        self.last: float | None = None

    async def forward(self, progress: float, total: float | None, message: str | None) -> None:
        if self.done or (self.last is not None and progress <= self.last):
            return
        self.last = progress
        self.context.progress(progress, total, message)


async def failure(current: Session, exc: MCPError, server: str) -> ToolbusError:
    """What an `MCPError` raised by `tools/call` is for its caller: the one place it is told.

    The SDK raises `MCPError` for an error answer the server sent and for outcomes of its
    own, with codes of the same band: CONNECTION_CLOSED (-32000) when the connection
    closes under a request (and, over HTTP, when a request's response stream is lost),
    REQUEST_TIMEOUT (-32001) when a read timeout passes. Servers answer ordinary failures
    with those codes too (JSON-RPC's implementation-defined server errors; the SDK's own
    servers do for a tool raising `MCPError(-32000, ...)`), and nothing else in the
    exception tells the two apart. So the code decides nothing on its own: a -32000 is a
    lost connection only when the transport says the connection is over (`lost`);
    anything else is the server's answer to this one call, `tool_error` with its
    `mcp_code`, and the session and every other call on it go on.
    """
    if exc.code == CONNECTION_CLOSED and await lost(current, server):
        current.end("the connection closed")
        return Unavailable(f"MCP server {server} closed the connection", server=server)
    if exc.code == CONNECTION_CLOSED and _response_lost(current, exc):
        # The session lives, but this call's answer will never come: it may have run.
        # Not `tool_error` (which says it ran and failed), and nothing restarts.
        return Unavailable(
            f"MCP server {server}: the response to this call was lost ({exc.error.message})",
            server=server,
            response_lost=True,
        )
    return call_error(exc, server)


def _response_lost(current: Session, exc: MCPError) -> bool:
    return current.ping_to_tell_s is not None and exc.error.message.startswith(SDK_LOST_RESPONSE)


async def lost(current: Session, server: str) -> bool:
    """Whether the session's connection is over, by the transport's own account: the
    session has ended (the stdio transport ends it before the SDK sees the pipes close),
    or, over HTTP, the server does not answer a ping."""
    if current.ended.is_set():
        return True
    if current.ping_to_tell_s is None:
        return False  # stdio: while the session is open, so are the pipes
    why = await unanswered(current, current.ping_to_tell_s, server)
    if why is not None:
        current.end(f"no answer to a ping: {why}")
        return True
    return current.ended.is_set()


async def unanswered(current: Session, timeout_s: float, server: str) -> str | None:
    """Why the server did not answer a probe (`era.probe`) within `timeout_s`, or None.

    An error answer is an answer: a server that says "method not found" to `ping`, or
    fails `server/discover` with an error of its own, is there, and its session and the
    calls on it go on (told once per session, at info). Only the transport's words say
    it is not: a timeout, a broken connection, an error the SDK made up in place of an
    answer (`stand_in`), or the session ended meanwhile (an HTTP 404 on its id: `http`).
    """
    try:
        async with asyncio.timeout(timeout_s):
            await probe(current.session)  # `ping`, or `server/discover` from 2026-07-28 on
    except MCPError as exc:
        if current.ended.is_set():
            return current.why
        if stand_in(exc):
            return describe(exc)
        if not current.probe_refused:
            current.probe_refused = True
            log.info(
                "mcp probe answered with an error",
                extra={"server": server, "mcp_code": exc.code},
            )
        return None
    except (TimeoutError, *TRANSPORT_ERRORS) as exc:
        return describe(exc)
    return None


def _meta() -> RequestParamsMeta:
    """The current trace context and baggage as the request's `_meta` (SEP-414)."""
    return cast(RequestParamsMeta, dict(inject_headers()))
