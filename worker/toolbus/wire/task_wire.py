"""Tasks on the wire: a task's state as pushed and as `{prefix}/tasks/get` answers it.

A call run as a task (`"task": true`) gets a `TaskState` at once (`status: working`, no
`ok`), one per status change, and then its final `Reply` with `task_id` and `status`.
`TaskGet` asks for a task's state by id; only the caller that started it gets it.
"""

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from toolbus.wire.model import WireModel as _Wire


class TaskStatus(StrEnum):
    """Where a task stands (MCP's task statuses)."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})


class TaskState(_Wire):
    """A task's state while it runs: its first reply, each status change, and what
    `tasks/get` answers meanwhile (no `ok`). Once it has ended, both get its final `Reply`
    (with `ok`, `result` or `error`, `task_id` and `status`)."""

    # First, as a progress update's `type`: a reader tells it from a reply by its start.
    type: Literal["task"] = Field(default="task", description="Always `task`: no reply.")
    id: str = Field(description="The id of the call the task runs.")
    task_id: str
    status: TaskStatus
    message: str | None = Field(default=None, description="What the task is doing now.")


class TaskGet(_Wire):
    """A request on `{prefix}/tasks/get` (or `{prefix}/tasks/get/{caller}`)."""

    task_id: str = Field(max_length=200)
    caller: str | None = Field(default=None, max_length=200)
    id: str | None = Field(default=None, max_length=200, description="Echoed in the answer.")
    reply_to: str | None = Field(
        default=None, max_length=1024, description="Reply topic for MQTT 3.1.1 callers."
    )


TASK_MODELS: dict[str, type[BaseModel]] = {"task-state": TaskState, "task-get": TaskGet}
