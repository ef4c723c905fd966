"""Task records: a call run as a task, kept so any worker can say how it stands.

A record holds the task's owner (the worker running it), caller, reply address, status,
the final reply once there is one, and when it expires (`task_ttl_s` after it started).
`MemoryTasks` serves one worker; `RedisTasks` (redis_tasks.py) a pool sharing one Redis,
where an owner's heartbeat tells whether it still runs its tasks: a task whose owner
died is marked failed (in doubt) by whichever worker notices first, never left working.

Records are bounded by bytes per caller: a caller's flood of large results displaces its
own oldest finished records (then its result is not kept: `reply_not_kept`), never
another caller's.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Protocol, Self

from toolbus.dedup.holdings import Holdings
from toolbus.wire.contracts import ErrorBody, ErrorCode, Reply

WORKING = "working"
# How often a worker looks for tasks whose owner died (calls/tasks.py): the owners'
# heartbeat period (`redis_fleet.HEARTBEAT_S`), here where no Redis client is imported, so
# a worker without the `redis` extra still runs tasks in memory.
SWEEP_S = 2.0
FINISHED = frozenset({"completed", "failed", "cancelled"})
TASK_CALLER_MAX_BYTES = 4 * 1024 * 1024


def task_id_of(key: str) -> str:
    """A task's id, from its call's dedup key: a retried request names the same task."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class TaskRecord:
    task_id: str
    ident: str  # the call's id
    caller: str | None
    owner: str  # `worker_id/incarnation` of the worker running it
    reply_topic: str
    correlation: str | None  # hex of the v5 correlation data
    status: str = WORKING
    message: str | None = None
    reply: str | None = None  # the final reply's JSON, once finished
    created_at: float = 0.0  # Unix time
    expires_at: float = 0.0  # Unix time: `unknown_task` after

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> TaskRecord:
        return cls(**json.loads(raw))

    def size(self) -> int:
        return len(self.to_json())


class TaskStore(Protocol):
    """Where task records live; each method may raise when the store is unreachable."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    @property
    def owner(self) -> str:
        """This worker, as its records name their owner."""

    async def create(self, record: TaskRecord) -> TaskRecord | None:
        """Keep a new task; the one kept already under its id instead (a retry), if any."""

    async def get(self, task_id: str) -> TaskRecord | None:
        """The task as it stands (failed in doubt if its owner died); None: unknown."""

    async def update(self, task_id: str, status: str, message: str | None) -> bool:
        """A running task's new status; False when it was not kept (the task has ended,
        or another worker owns it): then it must not be told either."""

    async def finish(self, record: TaskRecord) -> TaskRecord | None:
        """Keep the task's end (`record` finished); what was kept (a result over the
        caller's bound is not: its reply says `reply_not_kept`). None when the task had
        ended already (failed in doubt by a sweep or a drain) or is another owner's: its
        end was told, and this one must not be."""

    async def orphans(self) -> list[TaskRecord]:
        """Tasks whose owner died, marked failed now (each returned to one worker once)."""

    def running(self) -> int:
        """How many tasks this worker runs now."""


def orphaned(record: TaskRecord) -> TaskRecord:
    """`record` failed in doubt: its owner died (or stopped) while the task ran."""
    error = ErrorBody(
        code=ErrorCode.IN_DOUBT,
        message="the worker running the task stopped before it finished",
        details={"in_doubt": True, "cause": "worker_lost", "started": True},
    )
    reply = Reply(
        id=record.ident,
        ok=False,
        error=error,
        duration_ms=round(max(0.0, time.time() - record.created_at) * 1000, 3),
        task_id=record.task_id,
        status="failed",
    )
    ended = reply.model_dump_json(exclude_none=True)
    return replace(record, status="failed", message=None, reply=ended)


class MemoryTasks:
    """One worker's tasks, in its memory: its own are never orphans while it lives."""

    def __init__(self, worker_id: str, *, caller_max_bytes: int = TASK_CALLER_MAX_BYTES) -> None:
        self._owner = f"{worker_id}/memory"
        self._records: OrderedDict[str, TaskRecord] = OrderedDict()
        self._bytes: Holdings[str | None] = Holdings(caller_max_bytes)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @property
    def owner(self) -> str:
        return self._owner

    def held_bytes(self, caller: str | None) -> int:
        return self._bytes.held(caller)

    def _expire(self) -> None:
        now = time.time()
        for task_id, record in list(self._records.items()):
            if record.expires_at <= now:
                self._drop(task_id)

    def _drop(self, task_id: str) -> None:
        record = self._records.pop(task_id)
        self._bytes.remove(record.caller, record.size())

    def _put(self, record: TaskRecord) -> None:
        if record.task_id in self._records:
            self._drop(record.task_id)
        self._records[record.task_id] = record
        self._bytes.add(record.caller, record.size())

    def _room(self, caller: str | None, size: int) -> bool:
        """Make room for `size` more bytes of `caller`'s by dropping its oldest finished
        records; False when even that is not enough."""
        for task_id, record in list(self._records.items()):
            if self._bytes.fits(caller, size):
                break
            if record.caller == caller and record.finished:
                self._drop(task_id)
        return self._bytes.fits(caller, size)

    async def create(self, record: TaskRecord) -> TaskRecord | None:
        self._expire()
        kept = self._records.get(record.task_id)
        if kept is not None:
            return kept
        if not self._room(record.caller, record.size()):
            raise TaskBoundExceeded(record.caller)
        self._put(record)
        return None

    async def get(self, task_id: str) -> TaskRecord | None:
        self._expire()
        return self._records.get(task_id)

    async def update(self, task_id: str, status: str, message: str | None) -> bool:
        kept = self._records.get(task_id)
        if kept is None or kept.finished:
            return False
        self._put(replace(kept, status=status, message=message))
        return True

    async def finish(self, record: TaskRecord) -> TaskRecord | None:
        kept = self._records.get(record.task_id)
        if kept is not None and (kept.finished or kept.owner != record.owner):
            return None  # ended already: its end was told
        if kept is not None:
            self._drop(record.task_id)
        if not self._room(record.caller, record.size()):
            record = replace(record, reply=not_kept(record))
        self._put(record)
        return record

    async def orphans(self) -> list[TaskRecord]:
        return []

    def running(self) -> int:
        return sum(not r.finished and r.owner == self._owner for r in self._records.values())


class TaskBoundExceeded(Exception):
    """A caller's task records fill its bound with tasks still running."""


def not_kept(record: TaskRecord) -> str:
    """The final reply without its result: over the caller's bound."""
    reply = json.loads(record.reply or "{}")
    reply.pop("result", None)
    reply["ok"] = False
    reply["error"] = {
        "code": "reply_not_kept",
        "message": "the task's result is larger than its caller's task records may hold",
        "details": {"caller_max_bytes": True},
    }
    return json.dumps(reply, separators=(",", ":"))
