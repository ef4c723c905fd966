"""Invocation: one tool run within its deadline, cancellable by its caller.

`invoke_within` is the one place a tool is invoked: it arms the deadline's timer and
the running call's cancel on the task that awaits the tool, and on the way out tells
its own cancellations (`timeout`, `cancelled`) from anyone else's (a stopping worker).
"""

from __future__ import annotations

import asyncio
from typing import Any

from toolbus.calls.preparation import explain
from toolbus.calls.running import RunningCall
from toolbus.tools.context import CallContext
from toolbus.tools.registry import LOCAL, Tool
from toolbus.wire.contracts import ToolResult
from toolbus.wire.errors import CallTimeout, Cancelled, InvalidArguments


async def invoke_within(
    tool: Tool,
    arguments: dict[str, Any],
    deadline_s: float,
    context: CallContext,
    *,
    cap_s: float | None = None,
) -> ToolResult:
    """The tool's result, `CallTimeout` once `deadline_s` has passed, or `Cancelled`
    once its caller cancels it (the tool is cancelled either way). What
    `asyncio.timeout` does, in a third of its steps: one timer that cancels this task,
    and on the way out, telling our cancellations from anyone else's (a shutdown's)
    by the task's count of pending cancellations.

    A caller that allows it (`extend_on_progress`) has each progress update restart the
    deadline (`deadline_s` from the update), never past `cap_s` from the start."""
    task = asyncio.current_task()
    assert task is not None  # the pipeline runs every call in a task
    cancelling = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    loop = asyncio.get_running_loop()
    timer = loop.call_later(deadline_s, expire)
    running = context if isinstance(context, RunningCall) else None
    if running is not None:
        running.arm(task)
        if running.extend_on_progress and cap_s is not None and cap_s > deadline_s:
            cap_at = loop.time() + cap_s

            def extend() -> None:
                nonlocal timer
                if expired:
                    return
                timer.cancel()
                timer = loop.call_at(min(loop.time() + deadline_s, cap_at), expire)

            running.extending(extend)
    ours = False
    try:
        try:
            return await tool.invoke(arguments, context)
        finally:
            timer.cancel()
            by_caller = running is not None and running.delivered
            if running is not None:
                running.disarm()
                running.extending(None)
                running.span = None  # a task the tool left behind reports to no ended span
            # Take back our cancellations, however the tool ended.
            for _ in range(expired + by_caller):
                ours = task.uncancel() <= cancelling
    except asyncio.CancelledError:
        if ours and running is not None and running.delivered:
            raise cancelled(running, started=True, mcp=tool.origin != LOCAL) from None
        if ours:
            raise CallTimeout(
                f"{tool.name} did not finish within {deadline_s:g} s; the call was cancelled",
                timeout_s=deadline_s,
            ) from None
        raise
    except InvalidArguments as error:  # a tool may refuse its arguments itself
        explain(error, tool)
        raise


def cancelled(running: RunningCall, *, started: bool, mcp: bool = False) -> Cancelled:
    """The answer to a cancelled call: whether its tool had started, and whether what
    it did may have taken effect (an MCP server may have acted before the cancel came;
    a local tool stops at its next `await`)."""
    return Cancelled(
        "the caller cancelled the call"
        + (" while it ran" if started else " before it started; it was not run"),
        started=started,
        in_doubt=started and mcp,
        cause=running.cancel_cause,
    )
