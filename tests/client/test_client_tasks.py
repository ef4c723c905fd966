"""`toolbus.client.tasks` against a real broker and worker: a task run to its end, and
tasks/get while it runs and after."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.tools import Probe, probe_tools
from toolbus import Client
from toolbus.client.tasks import run_task, task
from toolbus.wire.errors import UnknownTask
from toolbus.wire.task_wire import TaskState


async def test_a_task_from_the_client_and_its_state(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    probe = Probe()
    settings = make_settings(broker)
    async with (
        running_worker(settings, probe_tools(probe)),
        Client(broker.url, prefix=settings.topic_prefix) as client,
    ):
        running = asyncio.create_task(run_task(client, "gate", id="c-task-1", timeout_s=20))
        await probe.wait_active(1)
        # The task id a worker gives this request id (its dedup key's): tasks/get while it runs.
        state = await task(client, _task_id_of(client, "c-task-1"))
        assert isinstance(state, TaskState) and state.status == "working"
        probe.release.set()
        reply = await running
        assert reply.ok and reply.status == "completed" and reply.task_id == state.task_id
        ended = await task(client, reply.task_id)
        assert not isinstance(ended, TaskState) and ended.ok
        with pytest.raises(UnknownTask):
            await task(client, "no-such-task", timeout_s=5)
    # The `working` first reply is read past quietly, not warned about as unreadable.
    assert not [r for r in caplog.records if r.name == "toolbus.client" and r.levelno >= 30]


def _task_id_of(client: Client, ident: str) -> str:
    from toolbus.dedup import Once
    from toolbus.dedup.tasks import task_id_of

    key = Once.key(client.caller, client.reply_topic, ident)
    assert key is not None
    return task_id_of(key)
