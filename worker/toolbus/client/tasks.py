"""Tasks from a `Client`: start one and wait for its end, or ask how one stands.

`run_task(client, tool, arguments)` sends the call with `"task": true` and waits for its
final reply (the `Reply` with `ok`, `task_id` and `status`), through the client's
requester: re-sent under the same id while nothing comes and across reconnects, and a
re-send is the same task (the worker answers its state; nothing runs twice). The
`working` first reply and status pushes carry no `ok`: the wait reads past them.
`task(client, task_id)` asks `{prefix}/tasks/get`: a `TaskState` while the task runs,
its final `Reply` once it has ended; `UnknownTask` for none of this caller's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from toolbus.client.answers import OnProgress, final
from toolbus.client.answers import raise_failed as _raise_failed
from toolbus.client.client import REPLY_GRACE_S, Client
from toolbus.wire.contracts import Reply
from toolbus.wire.task_wire import TaskState


async def run_task(
    client: Client,
    tool: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    id: str | None = None,
    timeout_s: float | None = None,
    on_progress: OnProgress | None = None,
    extend_on_progress: bool = False,
) -> Reply:
    """Run `tool` as a task and return its final reply (raising as `Client.call` does);
    `on_progress` and `extend_on_progress` as for `Client.call`. Cancelling the awaiting
    task cancels the task on the worker (as it does a call)."""
    ident = id or uuid.uuid4().hex
    body: dict[str, Any] = {"id": ident, "task": True, "arguments": dict(arguments or {})}
    if on_progress is not None:
        body["progress"] = True
    if extend_on_progress:
        body["extend_on_progress"] = True
    if client._in_topic and client.caller:
        topic = f"{client.prefix}/call/{client.caller}/{tool}"
    else:
        topic, body["tool"] = f"{client.prefix}/call", tool
    body = client._claimed(body)
    parse = Reply.model_validate_json
    reply = await client._ask(topic, body, timeout_s, ident, parse, on_progress=on_progress)
    return _raise_failed(reply)


async def task(
    client: Client, task_id: str, *, timeout_s: float | None = None
) -> TaskState | Reply:
    """How the task stands: its state while it runs, its final reply once it ended."""
    topic = f"{client.prefix}/tasks/get"
    if client._in_topic and client.caller:
        topic = f"{topic}/{client.caller}"
    body = client._claimed({"task_id": task_id})
    # Every answer is final here (a state is no "did not run"): the requester, not `_ask`.
    answer = await client._requester.request(
        topic,
        json.dumps(body).encode(),
        _state,
        timeout_s=timeout_s if timeout_s is not None else client._timeout_s,
        grace_s=REPLY_GRACE_S,
        correlation=uuid.uuid4().bytes,
        ident=None,
        judge=final,
    )
    return _raise_failed(answer) if isinstance(answer, Reply) else answer


def _state(payload: bytes) -> TaskState | Reply:
    raw = json.loads(payload)
    if isinstance(raw, dict) and "ok" in raw:
        return Reply.model_validate(raw)
    return TaskState.model_validate(raw)
