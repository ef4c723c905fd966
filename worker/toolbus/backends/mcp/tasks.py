"""An MCP tool that runs only as a task (`execution.taskSupport: "required"`), called as one.

Such a tool answers a plain `tools/call` with an error, so toolbus always calls it with
`task` and follows the task to its end, whether or not the caller asked for a toolbus
task: the caller simply gets the final reply. The mcp SDK has the tasks types but no
client API (issue 31 notes): `tools/call` with `task` goes through the session's
dispatcher (its result is a `CreateTaskResult`, which `send_request`'s validation of
`tools/call` would refuse), then `tasks/get` is polled at the server's `pollInterval`
(status notifications are session-scoped and arrive twice from some servers: polling is
the reliable path), and `tasks/result` fetches the result, checked against the tool's
`outputSchema` as a plain call's is (`output_schema`). Each status change (with its
`statusMessage`) goes to the call's context: relayed to a caller that asked for a task.
Cancelled (the caller, the deadline, a stopping worker), the task is cancelled upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from mcp.shared.dispatcher import CallOptions
from mcp_types import (
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    RequestParamsMeta,
    Task,
)
from pydantic import ValidationError

from toolbus.backends.mcp.session import Session
from toolbus.tools.context import CallContext
from toolbus.wire.errors import Cancelled, ToolFailed

TASK_TTL_MS = 3_600_000  # what we ask the server to keep the task; it may keep less
MIN_POLL_S, MAX_POLL_S = 0.1, 5.0  # around the server's pollInterval
CANCEL_BOUND_S = 5.0
MAX_MESSAGE_CHARS = 1024  # a server's status message is a status line


async def call_as_task(
    current: Session,
    remote_name: str,
    arguments: dict[str, Any],
    meta: RequestParamsMeta | None,
    context: CallContext,
) -> CallToolResult:
    """`tools/call` as a task, followed to its end; its result as a plain call's."""
    params: dict[str, Any] = {
        "name": remote_name,
        "arguments": arguments,
        "task": {"ttl": TASK_TTL_MS},
    }
    if meta:
        params["_meta"] = dict(meta)
    session = current.session
    opts: CallOptions = {}
    session._stamp({"method": "tools/call", "params": params}, opts)
    raw = await session._dispatcher.send_raw_request("tools/call", params, opts)
    try:
        if isinstance(raw, dict) and "task" not in raw:  # it ran it at once: its result
            return await _checked(current, remote_name, CallToolResult.model_validate(raw))
        task = CreateTaskResult.model_validate(raw).task
    except ValidationError:  # the peer's answer, not the transport: its tool failed
        raise ToolFailed(
            "the MCP server answered a task's tools/call with neither a task nor a result",
            reason="bad_task_answer",
        ) from None
    try:
        task = await _followed(current, task, context)
    except asyncio.CancelledError:
        await _cancel_upstream(current, task.task_id)
        raise
    if task.status == "completed":
        payload = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task.task_id))
        return await _checked(
            current, remote_name, await session.send_request(payload, CallToolResult)
        )
    if task.status == "cancelled":
        raise Cancelled("the MCP server cancelled the task", started=True, cause="server")
    said = (task.status_message or "")[:MAX_MESSAGE_CHARS]  # a status line, cut
    raise ToolFailed(said or f"the MCP server's task {task.status}")


async def _checked(current: Session, remote_name: str, result: CallToolResult) -> CallToolResult:
    """The result, checked against the tool's `outputSchema` as `call_tool` checks a plain
    call's (the SDK's `RuntimeError`, which `output_schema` makes the caller's error)."""
    if not result.is_error:
        await current.session.validate_tool_result(remote_name, result)
    return result


async def _followed(current: Session, task: Task, context: CallContext) -> Task:
    """Polled until it ends; each new status (or message) told to the context."""
    told: tuple[str, str | None] | None = None
    while True:
        now = (task.status, task.status_message)
        if now != told:
            context.task_status(task.status, task.status_message)
            told = now
        if task.status in ("completed", "failed", "cancelled"):
            return task
        interval = (task.poll_interval or 1000) / 1000
        await asyncio.sleep(min(MAX_POLL_S, max(MIN_POLL_S, interval)))  # the server's pace
        asked = GetTaskRequest(params=GetTaskRequestParams(task_id=task.task_id))
        task = await current.session.send_request(asked, GetTaskResult)


async def _cancel_upstream(current: Session, task_id: str) -> None:
    """`tasks/cancel`, bounded and shielded: the call is being cancelled already."""
    cancel = CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CANCEL_BOUND_S):
            await asyncio.shield(current.session.send_request(cancel, CancelTaskResult))
