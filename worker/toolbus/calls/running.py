"""Running calls: each call from its claim to its reply, with a home, found by its dedup key.

A `RunningCall` is the engine's side of a tool's `CallContext` (tools/context.py): the
key a repeat or a cancel names it by, the caller's deadline, why it is being cancelled,
and the progress sink of the door that built it. `RunningCalls` maps keys to the calls
this worker runs now, so a cancel finds its target (shaped after arq's `job_tasks` by
job id). It holds one entry per call between its claim and its reply: bounded by the
worker's slots, never by what a caller sends.

Cancelling cancels the asyncio task running the tool, only while it runs (`arm`): a
local tool gets `CancelledError`; an MCP call's SDK sends `notifications/cancelled`
(stdio) or closes the request's stream (HTTP). Before the tool starts, the cause is
noted and the executor does not start it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry import trace

from toolbus.tools.context import Answers, Resume
from toolbus.wire.asking import InputRequest


class ProgressSink(Protocol):
    """Where a call's progress goes: the door that received the call (synchronous,
    never blocking: the door queues, orders and rate-limits)."""

    def __call__(self, progress: float, total: float | None, message: str | None) -> None: ...


class Asker(Protocol):
    """Who puts a running call's questions to its caller (calls/rounds.py): the answers,
    or None when there are none. Never raises."""

    async def __call__(self, questions: dict[str, InputRequest]) -> Answers | None: ...


class StatusSink(Protocol):
    """Where an upstream task's status changes go (synchronous, never blocking)."""

    def __call__(self, status: str, message: str | None) -> None: ...


@dataclass(eq=False, slots=True)
class RunningCall:
    """One call from its claim to its reply; its tool's `CallContext`."""

    key: str | None
    caller: str | None
    ident: str
    deadline_at: float | None = None
    sink: ProgressSink | None = None  # None: the caller did not ask for progress
    cancel_cause: str | None = None
    delivered: bool = False  # the cancel reached the tool's task (it had started)
    extend_on_progress: bool = False  # the caller lets progress push the deadline
    # The call's `execute_tool` span: progress and a cancel are events on it.
    span: trace.Span | None = None
    status_sink: StatusSink | None = None  # None: not run as a toolbus task
    asker: Asker | None = None  # None: the caller cannot answer (no `input: true`)
    resume: Resume | None = None  # a stateless server's call continued: what to call with
    _task: asyncio.Task[object] | None = field(default=None, repr=False)
    _extend: Callable[[], None] | None = field(default=None, repr=False)
    _retime: Callable[[float | None], None] | None = field(default=None, repr=False)

    @property
    def wants_progress(self) -> bool:
        return self.sink is not None

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        if self.sink is None or self.cancel_cause is not None:
            return
        if self.span is not None:
            # Only how far: a message may quote what the tool works on (arguments).
            attributes = {"toolbus.progress": progress}
            if total is not None:
                attributes["toolbus.progress.total"] = total
            self.span.add_event("toolbus.progress", attributes)
        if self._extend is not None:
            self._extend()
        self.sink(progress, total, message)

    def extending(self, extend: Callable[[], None] | None) -> None:
        """What pushes the deadline on each progress update (`invoke_within`'s timer)."""
        self._extend = extend

    def retiming(self, retime: Callable[[float | None], None] | None) -> None:
        """What restarts the deadline (`invoke_within`'s timer): in so many seconds, or
        never (None: while the call waits for its caller's answers)."""
        self._retime = retime

    def retime(self, seconds: float | None) -> None:
        if self._retime is not None:
            self._retime(seconds)

    def task_status(self, status: str, message: str | None) -> None:
        if self.status_sink is not None and self.cancel_cause is None:
            self.status_sink(status, message)

    @property
    def wants_input(self) -> bool:
        return self.asker is not None

    async def ask(self, questions: dict[str, InputRequest]) -> Answers | None:
        if self.asker is None or self.cancel_cause is not None:
            return None
        return await self.asker(questions)

    def arm(self, task: asyncio.Task[object]) -> None:
        """The tool runs in `task` now: a cancel cancels it."""
        self._task = task

    def disarm(self) -> None:
        self._task = None

    def cancel(self, cause: str) -> bool:
        """Stop the call for `cause`; False when it was cancelled already. A tool running
        now is cancelled; one not started yet is not started (the executor asks)."""
        if self.cancel_cause is not None:
            return False
        self.cancel_cause = cause
        if self.span is not None:
            started = self._task is not None
            self.span.add_event("toolbus.cancel", {"cause": cause, "started": started})
        if self._task is not None:
            self.delivered = True
            self._task.cancel()
        return True


class RunningCalls:
    """The calls this worker runs now, by dedup key (copies of one request share a key)."""

    def __init__(self) -> None:
        self._calls: dict[str, list[RunningCall]] = {}

    def __len__(self) -> int:
        return sum(len(calls) for calls in self._calls.values())

    @contextmanager
    def running(self, call: RunningCall) -> Iterator[RunningCall]:
        """`call` is found by its key while the block runs (a call without a key is not)."""
        key = call.key
        if key is None:
            yield call
            return
        self._calls.setdefault(key, []).append(call)
        try:
            yield call
        finally:
            calls = self._calls[key]
            calls.remove(call)
            if not calls:
                del self._calls[key]

    def add(self, key: str, call: RunningCall) -> None:
        """`call` is found by `key` too, until `discard` (a held call by its requests')."""
        self._calls.setdefault(key, []).append(call)

    def discard(self, key: str, call: RunningCall) -> None:
        calls = self._calls.get(key)
        if calls is not None and call in calls:
            calls.remove(call)
            if not calls:
                del self._calls[key]

    def get(self, key: str) -> list[RunningCall]:
        return list(self._calls.get(key, ()))

    def cancel(self, key: str, cause: str) -> int:
        """Cancel every running copy of the call `key` names; how many were cancelled."""
        return sum(call.cancel(cause) for call in self.get(key))
