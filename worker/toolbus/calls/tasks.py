"""Tasks: a call that answers at once and pushes its end, kept so any worker can say how it is.

`Tasks.start(call, run)` keeps the task's record (dedup/tasks.py) and runs the call in the
background: the caller gets `working` at once, and the final reply (with `task_id` and
`status`) when it ends, both through the door's `Push`. A retried request (the same
dedup key) names the same task: it gets the task's state again, not a second run.

Nothing is left `working`: a stopping worker ends its running tasks failed in doubt
(`drain`), and every worker sweeps the store each heartbeat for tasks whose owner died
(`sweep`), marking them failed and pushing that end to their callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from opentelemetry import trace

from toolbus.calls.call import Call, ReplyAddress
from toolbus.calls.running import StatusSink
from toolbus.dedup import Once
from toolbus.dedup.tasks import SWEEP_S, TaskRecord, TaskStore, orphaned, task_id_of
from toolbus.wire.contracts import Reply
from toolbus.wire.task_wire import TaskState, TaskStatus

log = logging.getLogger("toolbus.tasks")

MAX_QUEUED = 64  # status changes waiting to be relayed, per task
# An upstream task's status message is a status line: a server's longer text is cut, as a
# progress update's is (doors/envelope/progress.py), before it is kept and pushed.
MAX_STATUS_MESSAGE_CHARS = 1024
FINISHED_VALUES = frozenset({"completed", "failed", "cancelled"})  # the final reply says so

DRAIN_GRACE_S = 2.0  # a stopping worker's wait for its tasks' ends to be kept


class Push(Protocol):
    """Where a task's messages go: the door that received it publishes them."""

    async def __call__(self, address: ReplyAddress, message: Reply | TaskState) -> None: ...


def status_of(reply: Reply) -> TaskStatus:
    if reply.ok:
        return TaskStatus.COMPLETED
    if reply.error is not None and reply.error.code.value == "cancelled":
        return TaskStatus.CANCELLED
    return TaskStatus.FAILED


def state_of(record: TaskRecord) -> TaskState | Reply:
    """What a retry or `tasks/get` is told: the final reply once there is one."""
    if record.reply is not None:
        return Reply.model_validate_json(record.reply)
    return TaskState(
        id=record.ident,
        task_id=record.task_id,
        status=TaskStatus(record.status),
        message=record.message,
    )


def address_of(record: TaskRecord) -> ReplyAddress:
    correlation = bytes.fromhex(record.correlation) if record.correlation is not None else None
    return ReplyAddress(record.reply_topic, correlation)


class Tasks:
    """This worker's tasks, and the records every worker shares.

    Args:
        store: the task records (memory, or Redis for a pool).
        push: publishes a task's messages to its caller.
        ttl_s: how long a task's record (its result too) is kept (`task_ttl_s`).
    """

    def __init__(
        self, store: TaskStore, push: Push, *, ttl_s: float, tracer: trace.Tracer | None = None
    ) -> None:
        self.store = store
        self._tracer = tracer or trace.get_tracer("toolbus")
        self._push = push
        self._ttl_s = ttl_s
        self._running: dict[str, tuple[asyncio.Task[None], TaskRecord]] = {}
        self._drained: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def in_flight(self) -> int:
        return len(self._running)

    async def start(self, call: Call, run: Callable[[StatusSink], Awaitable[Reply]]) -> None:
        """Answer `working` at once and run the call; a retry gets its task's state."""
        assert call.reply is not None  # the door runs tasks only for calls with an address
        key = Once.key(call.caller, call.reply_topic, call.id) or call.id
        now = time.time()
        correlation = call.reply.correlation_data
        record = TaskRecord(
            task_id=task_id_of(key),
            ident=call.id,
            caller=call.caller,
            owner=self.store.owner,
            reply_topic=call.reply.topic,
            correlation=correlation.hex() if correlation is not None else None,
            created_at=now,
            expires_at=now + self._ttl_s,
        )
        kept = await self.store.create(record)
        if kept is not None:  # a retry: the same task, as it stands
            await self._push(call.reply, state_of(kept))
            return
        await self._push(
            call.reply, TaskState(id=call.id, task_id=record.task_id, status=TaskStatus.WORKING)
        )
        # The run outlives the message's span: its own span, a child of it, carries the
        # trace to the final reply (one trace from the request to the task's end).
        under = trace.get_current_span()
        span = (
            self._tracer.start_span(
                f"task {call.tool}", attributes={"toolbus.task_id": record.task_id}
            )
            if under.is_recording()
            else under
        )
        running = self._run_in(span, record, call.reply, run)
        task = asyncio.create_task(running, name=f"task-{record.task_id}")
        self._running[record.task_id] = (task, record)

    async def _run_in(
        self,
        span: trace.Span,
        record: TaskRecord,
        address: ReplyAddress,
        run: Callable[[StatusSink], Awaitable[Reply]],
    ) -> None:
        with trace.use_span(span, end_on_exit=span.is_recording()):
            await self._run(record, address, run)

    async def _run(
        self,
        record: TaskRecord,
        address: ReplyAddress,
        run: Callable[[StatusSink], Awaitable[Reply]],
    ) -> None:
        # Status changes in order, each kept and pushed before the next and before the end.
        changes: asyncio.Queue[tuple[str, str | None]] = asyncio.Queue(maxsize=MAX_QUEUED)

        def sink(status: str, message: str | None) -> None:
            with contextlib.suppress(asyncio.QueueFull):  # a flood: the latest still polled
                changes.put_nowait((status, message))

        relay = asyncio.create_task(self._relay(record, changes), name="task-status")
        try:
            reply = await run(sink)
            await changes.join()
            status = status_of(reply)
            reply = reply.model_copy(update={"task_id": record.task_id, "status": status.value})
            if record.task_id in self._drained:
                return  # ended by the drain already: its end was kept and pushed
            ended = replace(
                record, status=status.value, reply=reply.model_dump_json(exclude_none=True)
            )
            try:
                kept = await self.store.finish(ended)
            except Exception as exc:  # the caller still hears; `tasks/get` may not
                log.warning("task store failed keeping the end of %s: %s", record.ident, exc)
            else:
                if kept is None:  # failed in doubt meanwhile (its owner looked dead): told
                    log.warning("task %s ended after it was failed in doubt", record.task_id)
                    return
            await self._push(address, reply)
        finally:
            relay.cancel()
            self._running.pop(record.task_id, None)

    async def _relay(
        self, record: TaskRecord, changes: asyncio.Queue[tuple[str, str | None]]
    ) -> None:
        while True:
            status, message = await changes.get()
            try:
                if status in {s.value for s in TaskStatus} and status not in FINISHED_VALUES:
                    await self.status(record.task_id, TaskStatus(status), message)
            except Exception as exc:  # a status lost is not the task lost
                log.warning("task %s: could not relay a status: %s", record.ident, exc)
            finally:
                changes.task_done()

    async def status(self, task_id: str, status: TaskStatus, message: str | None) -> None:
        """A running task's new status (an upstream task's), kept and pushed."""
        entry = self._running.get(task_id)
        if entry is None:
            return
        _, record = entry
        if message is not None and len(message) > MAX_STATUS_MESSAGE_CHARS:
            message = message[: MAX_STATUS_MESSAGE_CHARS - 1] + "…"  # a status line
        if not await self.store.update(task_id, status.value, message):
            return  # ended meanwhile (failed in doubt by a sweep): its end was told
        state = TaskState(id=record.ident, task_id=task_id, status=status, message=message)
        await self._push(address_of(record), state)

    async def get(
        self, task_id: str, caller: str | None, reply_topic: str | None = None
    ) -> TaskState | Reply | None:
        """A task's state for `caller`; None: no such task of theirs (`unknown_task`). An
        anonymous caller's task is its reply topic's, as its call's dedup key is: asked
        from another reply topic, it is unknown (a task id is no secret)."""
        record = await self.store.get(task_id)
        if record is None or record.caller != caller or record.expires_at <= time.time():
            return None
        if caller is None and record.reply_topic != reply_topic:
            return None
        return state_of(record)

    def sweeping(self) -> None:
        """Start the sweep for dead owners' tasks (each heartbeat, for as long as it runs)."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="task-sweep")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)  # a period, not a synchronisation
            try:
                await self.sweep()
            except Exception as exc:  # the store away for a moment: sweep again next beat
                log.warning("task sweep failed: %s", exc)

    async def sweep(self) -> int:
        """Tasks whose owner died, failed in doubt and pushed to their callers now."""
        ended = await self.store.orphans()
        for record in ended:
            log.warning("task %s failed: its worker %s is gone", record.ident, record.owner)
            await self._push(address_of(record), state_of(record))
        return len(ended)

    async def drain(self, within_s: float) -> None:
        """The worker stops: tasks still running after `within_s` end failed in doubt,
        kept and pushed, so no `tasks/get` says `working` for them; then their runs are
        cancelled."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._running and within_s > 0:
            await asyncio.wait([task for task, _ in self._running.values()], timeout=within_s)
        for task_id, (task, record) in list(self._running.items()):
            self._drained.add(task_id)
            failed = orphaned(record)
            try:
                async with asyncio.timeout(DRAIN_GRACE_S):
                    await self.store.finish(failed)
                    await self._push(address_of(record), state_of(failed))
            except Exception as exc:
                log.warning("could not end task %s while stopping: %s", record.ident, exc)
            task.cancel()
        for task, _ in list(self._running.values()):
            with contextlib.suppress(BaseException):
                await task
