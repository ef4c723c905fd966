"""The broker's redelivery of a provider-only call after a worker restart (issue 30.1).

A provider's `call_0` with no id of ours beside it runs again when asked again after
its run, a new question; but the broker's own copy of the message, delivered again
to a worker that restarted before acknowledging it, is the same question and must not
run twice. The broker marks that copy (MQTT's DUP flag), and the worker replays it.

Real processes: a mosquitto this test freezes (SIGSTOP) while the reply waits for its
PUBACK, so the request is left unacknowledged with its run recorded in a real Redis;
`toolbus serve`, SIGKILLed then and restarted on its session; a 3.1.1 caller, and a v5
one that sends no Correlation Data.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli import ServeProcess, wait_ready
from tests.support.fleet import Executions, recording_env
from tests.support.harness import Broker, RedisServer
from tests.support.mqtt import Caller
from tests.support.processes import start_serve
from tests.support.providers import chat_completion

WAIT_S = 20.0


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker this test alone freezes."""
    broker = Broker(tmp_path)
    broker.start()
    yield broker
    broker.kill()


def freeze(broker: Broker, sig: signal.Signals) -> None:
    assert broker.process is not None
    broker.process.send_signal(sig)


async def start_worker(broker: Broker, env: dict[str, str]) -> ServeProcess:
    return ServeProcess(await start_serve(broker.url, env, stderr=asyncio.subprocess.PIPE))


async def killed(worker: ServeProcess) -> None:
    worker.proc.send_signal(signal.SIGKILL)
    await worker.proc.wait()
    worker._reader.cancel()


async def replies_until_replayed(caller: Caller, topic: str) -> list[dict[str, Any]]:
    """Replies on `topic` until one is a replay (the first reply may come too: it was
    on its way to the frozen broker when the worker died)."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT_S):
        while not (seen and seen[-1]["replayed"]):
            message = await caller.next_message(WAIT_S)
            if message.topic.value == topic:
                assert isinstance(message.payload, bytes)
                seen.append(json.loads(message.payload))
    return seen


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "v5-no-correlation"])
async def test_the_broker_s_copy_after_a_restart_is_replayed_not_run_again(
    own_broker: Broker, redis_server: RedisServer, tmp_path: Path, v5: bool
) -> None:
    prefix = f"dup{uuid.uuid4().hex[:8]}"
    executions = Executions(tmp_path / "executions")
    env = recording_env(
        tmp_path,
        prefix,
        worker_id=f"{prefix}-w1",
        dedup_store=redis_server.url,
        publish_timeout_s="1",
    )
    reply_topic = f"{prefix}/reply/dup"
    key = f"k-{uuid.uuid4().hex[:6]}"
    body = chat_completion(("call_0", "record", json.dumps({"key": key, "hold_s": 0.5})))
    body["toolbus"] = {"reply_format": "toolbus"} | ({} if v5 else {"reply_to": reply_topic})
    async with Caller(own_broker.url, v5=v5) as caller:
        first = await start_worker(own_broker, env)
        try:
            await wait_ready(caller, prefix)
            await caller.subscribe(reply_topic)
            # v5: a Response Topic and no Correlation Data; 3.1.1: `reply_to` in the body.
            await caller.publish(
                f"{prefix}/call", json.dumps(body), response_topic=reply_topic if v5 else None
            )
            await first.wait_event("record started")
            freeze(own_broker, signal.SIGSTOP)  # the reply will wait for its PUBACK
            try:
                # Run and recorded; its reply given up on, the request left unacknowledged.
                await first.wait_event("not acknowledged by the broker", timeout_s=WAIT_S)
            finally:
                await killed(first)
                freeze(own_broker, signal.SIGCONT)
        except BaseException:
            await killed(first)
            raise
        second = await start_worker(own_broker, env)  # the same session: the copy comes
        try:
            seen = await replies_until_replayed(caller, reply_topic)
        except TimeoutError:
            seen = []  # no replay: what ran says why
        finally:
            await killed(second)
    assert executions.counts()[key] == 1  # the broker's copy ran nothing
    assert seen and seen[-1]["id"] == "call_0" and seen[-1]["result"]["text"] == key
