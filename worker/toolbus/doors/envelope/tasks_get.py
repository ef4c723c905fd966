"""tasks/get: a caller asks how its task stands, on `{prefix}/tasks/get[/{caller}]`.

The body is `{"task_id", "id"?, "caller"?, "reply_to"?}`; the answer goes to the asker's
reply topic (v5 Response Topic with its Correlation Data, or 3.1.1 `reply_to`), checked
as a call's is. Who asks follows the worker's `caller_identity`: the body's `caller`
(`claim`) or the topic's level (`topic`, tied to the login by the broker's ACL). Only the
task's own caller learns of it: anyone else gets `unknown_task`, as for a task never
started or no longer kept.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import ValidationError

from toolbus.calls.call import ReplyAddress
from toolbus.calls.tasks import Tasks
from toolbus.doors.envelope.addresses import response_address
from toolbus.wire.contracts import ErrorBody, ErrorCode, Reply
from toolbus.wire.errors import BadRequest, Forbidden, ToolbusError, UnknownTask
from toolbus.wire.messages import Inbound, Outbound, Publisher
from toolbus.wire.task_wire import TaskGet, TaskState
from toolbus.wire.topics import Topics
from toolbus.wire.untrusted import shown


@dataclass(frozen=True, slots=True)
class TaskAsked:
    """A readable `tasks/get`: which task, for whom, answered where (None: nowhere)."""

    ident: str  # echoed as the answer's `id`
    task_id: str
    caller: str | None
    reply: ReplyAddress | None
    error: ToolbusError | None = None  # refused: this is the answer


def decode_task_get(message: Inbound, topics: Topics, topic_caller: str | None) -> TaskAsked:
    """The request, or why it cannot be answered (with its address when one is usable)."""
    asked: TaskGet | None = None
    with contextlib.suppress(ValueError, ValidationError):
        asked = TaskGet.model_validate(json.loads(message.payload))
    ident = (asked.id or asked.task_id) if asked is not None else ""
    claimed = asked.caller if asked is not None else None
    caller = topic_caller if topics.caller_identity == "topic" else claimed
    try:
        reply = response_address(message, topics, caller)
        if reply is None and asked is not None and asked.reply_to is not None:
            problem = topics.reply_problem(asked.reply_to, caller)
            if problem is not None:
                raise Forbidden("reply topic is not one a reply may go to", reason=problem)
            reply = ReplyAddress(asked.reply_to)
    except ToolbusError as refused:
        return TaskAsked(ident, "", caller, None, refused)
    if asked is None:
        bad = BadRequest('a tasks/get body is `{"task_id": ...}`', reason="bad_task_get")
        return TaskAsked(ident, "", caller, reply, bad)
    if topic_caller == "" or (topics.caller_identity == "topic" and caller is None):
        bad = BadRequest(f"no usable caller in {shown(message.topic)}", reason="bad_topic")
        return TaskAsked(ident, asked.task_id, None, reply, bad)
    return TaskAsked(ident, asked.task_id, caller or None, reply)


_NO_ADDRESS = ErrorBody(code=ErrorCode.BAD_REQUEST, message="a tasks/get needs a reply topic")


def refusal(ident: str, error: ToolbusError) -> Reply:
    """The answer to what is refused before anything runs."""
    return Reply(id=ident, ok=False, error=error.body(), duration_ms=0.0)


class TaskDoor:
    """The envelope's side of tasks: their messages published, `tasks/get` answered.

    Args:
        topics: the layout (reply topics are checked against it).
        publisher: where a task's states go.
        reply: publishes a reply as the pipeline does (traced).
        dead: dead-letters a message that cannot be answered.
    """

    def __init__(
        self,
        topics: Topics,
        publisher: Publisher,
        reply: Callable[[ReplyAddress, Reply], Awaitable[object]],
        dead: Callable[[Inbound, ErrorBody, str | None], Awaitable[None]],
    ) -> None:
        self._topics, self._publisher, self._reply, self._dead = topics, publisher, reply, dead

    async def push(self, address: ReplyAddress, message: Reply | TaskState) -> None:
        """A task's message to its caller: its final reply as any reply, its states bare."""
        if isinstance(message, Reply):
            await self._reply(address, message)
            return
        payload = message.model_dump_json(exclude_none=True).encode()
        data = address.correlation_data
        await self._publisher.publish(Outbound(address.topic, payload, correlation_data=data))

    async def get(self, message: Inbound, topic_caller: str | None, tasks: Tasks | None) -> None:
        """`tasks/get`: the task's state for its own caller, else `unknown_task`."""
        asked = decode_task_get(message, self._topics, topic_caller)
        if asked.reply is None:
            error = asked.error.body() if asked.error is not None else _NO_ADDRESS
            await self._dead(message, error, asked.ident or None)
            return
        if asked.error is not None or tasks is None:
            refused = asked.error or UnknownTask("this worker keeps no tasks")
            await self.push(asked.reply, refusal(asked.ident, refused))
            return
        state = await tasks.get(asked.task_id, asked.caller, asked.reply.topic)
        if state is None:
            unknown = UnknownTask("no such task for this caller", task_id=asked.task_id)
            await self.push(asked.reply, refusal(asked.ident, unknown))
            return
        await self.push(asked.reply, state)
