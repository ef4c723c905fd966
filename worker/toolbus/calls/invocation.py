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
    deadline = _Deadline(task, deadline_s)
    running = context if isinstance(context, RunningCall) else None
    if running is not None:
        running.arm(task)
        if running.extend_on_progress and cap_s is not None and cap_s > deadline_s:
            deadline.cap_at = deadline.loop.time() + cap_s
            running.extending(deadline.extend)
        running.retiming(deadline.retime)
    ours = False
    try:
        try:
            return await tool.invoke(arguments, context)
        finally:
            deadline.cancel()
            expired = deadline.expired
            by_caller = running is not None and running.delivered
            if running is not None:
                running.disarm()
                running.extending(None)
                running.retiming(None)
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


class _Deadline:
    """One timer that cancels the task running the tool when the deadline passes; each
    progress update may restart it (up to `cap_at`), and a question to the caller stops
    it until the answers come (`retime`)."""

    __slots__ = ("cap_at", "expired", "loop", "seconds", "task", "timer")

    def __init__(self, task: asyncio.Task[Any], seconds: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = task
        self.seconds = seconds
        self.expired = False
        self.cap_at: float | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(seconds, self.expire)

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def extend(self) -> None:
        """A progress update: `seconds` from now, never past `cap_at`."""
        if self.expired or self.timer is None or self.cap_at is None:
            return  # a stopped timer stays stopped: the call waits for its caller
        self.timer.cancel()
        self.timer = self.loop.call_at(
            min(self.loop.time() + self.seconds, self.cap_at), self.expire
        )

    def retime(self, seconds: float | None) -> None:
        """`seconds` from now, or no deadline at all (None)."""
        if self.expired:
            return
        self.cancel()
        self.timer = None if seconds is None else self.loop.call_later(seconds, self.expire)


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
