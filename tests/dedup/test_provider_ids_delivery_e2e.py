"""A provider-only call's DUP copy of another delivery, and a new question over a run cut
short, through a real broker (issue 30.1, review A and E).

A: the broker's DUP flag says it sent a message before, not that a worker read it. The
worker is frozen (SIGSTOP) after turn 1 ran, so turn 2 (the same `call_0`, the same
arguments) reaches its socket unread; killed and restarted on its session, it gets
turn 2 from mosquitto with DUP set, for the first time. Turn 2 must run, not get turn 1's
stored reply.

E: the worker is killed while turn 1 runs, leaving its record `started` by a worker that
is gone. The broker's copy of turn 1 (the same delivery) is `in_doubt`, as it should be;
turn 2, a new message asking the same, must run, not be `in_doubt` until `dedup_ttl_s`.

Real processes: mosquitto, `toolbus serve` (SIGSTOPped, SIGKILLed, restarted on its
session), a real Redis; a 3.1.1 caller and a v5 one without Correlation Data.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli import ServeProcess, wait_ready
from tests.dedup.test_provider_ids_dup import WAIT_S, killed, own_broker, start_worker
from tests.support.fleet import Executions, recording_env
from tests.support.harness import Broker, RedisServer
from tests.support.mqtt import Caller
from tests.support.providers import chat_completion

__all__ = ["own_broker"]  # the broker fixture of test_provider_ids_dup.py


class Turns:
    """One caller's turns: each the same `call_0` asking `record` the same, no id of ours."""

    def __init__(self, caller: Caller, prefix: str, key: str, hold_s: float, *, v5: bool):
        self.caller, self.prefix, self.v5 = caller, prefix, v5
        self.reply_topic = f"{prefix}/reply/turns"
        arguments = json.dumps({"key": key, "hold_s": hold_s})
        self.body = chat_completion(("call_0", "record", arguments))
        self.body["toolbus"] = {"reply_format": "toolbus"} | (
            {} if v5 else {"reply_to": self.reply_topic}
        )

    async def send(self) -> None:
        """Published (QoS 1) and acknowledged by the broker: it has gone to the worker's
        session (mosquitto writes it out before it acknowledges the publish)."""
        await self.caller.publish(
            f"{self.prefix}/call",
            json.dumps(self.body),
            response_topic=self.reply_topic if self.v5 else None,
        )

    async def reply(self) -> dict[str, Any]:
        async with asyncio.timeout(WAIT_S):
            while True:
                message = await self.caller.next_message(WAIT_S)
                if message.topic.value == self.reply_topic:
                    assert isinstance(message.payload, bytes)
                    return dict(json.loads(message.payload))

    async def first_run(self) -> tuple[dict[str, Any], int]:
        """The first reply that is no replay, and how many replays came before it: the
        broker's copy of turn 1 may come first, when the worker was frozen before its
        acknowledgement of turn 1 (sent once turn 1's reply was) left."""
        replays = 0
        while (reply := await self.reply())["replayed"]:
            replays += 1
        return reply, replays


def worker_env(tmp_path: Path, prefix: str, redis_server: RedisServer) -> dict[str, str]:
    return recording_env(tmp_path, prefix, worker_id=f"{prefix}-w1", dedup_store=redis_server.url)


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "v5-no-correlation"])
async def test_turn_2_first_delivered_with_dup_runs(
    own_broker: Broker, redis_server: RedisServer, tmp_path: Path, v5: bool
) -> None:
    prefix = f"dlv{uuid.uuid4().hex[:8]}"
    key = f"k-{uuid.uuid4().hex[:6]}"
    executions = Executions(tmp_path / "executions")
    env = worker_env(tmp_path, prefix, redis_server)
    async with Caller(own_broker.url, v5=v5) as caller:
        turns = Turns(caller, prefix, key, 0.0, v5=v5)
        first = await start_worker(own_broker, env)
        try:
            await wait_ready(caller, prefix)
            await caller.subscribe(turns.reply_topic)
            await turns.send()
            turn_1 = await turns.reply()
            first.proc.send_signal(signal.SIGSTOP)  # reads nothing from here on
            await turns.send()  # turn 2: written to the frozen worker's socket, unread
        finally:
            await killed(first)  # SIGKILL ends a stopped process too
        second = await start_worker(own_broker, env)  # its session: turn 2 again, DUP set
        try:
            # Today's main: turn 2 gets turn 1's answer, and no run comes (TimeoutError).
            turn_2, replays = await turns.first_run()
        finally:
            await killed(second)
    assert turn_1["ok"] and turn_1["replayed"] is False
    assert turn_2["ok"] and turn_2["id"] == "call_0" and replays <= 1
    assert executions.counts()[key] == 2


async def test_a_new_question_over_a_run_cut_short_runs(
    own_broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"cut{uuid.uuid4().hex[:8]}"
    key = f"k-{uuid.uuid4().hex[:6]}"
    executions = Executions(tmp_path / "executions")
    env = worker_env(tmp_path, prefix, redis_server)
    async with Caller(own_broker.url, v5=False) as caller:
        # Long enough to be killed in, short enough for turn 2 to run through.
        turns = Turns(caller, prefix, key, 2.0, v5=False)
        first = await start_worker(own_broker, env)
        try:
            await wait_ready(caller, prefix)
            await caller.subscribe(turns.reply_topic)
            await turns.send()
            await first.wait_event("record started", timeout_s=WAIT_S)
        finally:
            await killed(first)  # mid-run: its record stays `started`, its worker gone
        second: ServeProcess = await start_worker(own_broker, env)
        try:
            copy = await turns.reply()  # the broker's copy of turn 1: the same delivery
            await turns.send()  # turn 2: a new message asking the same
            turn_2 = await turns.reply()
        finally:
            await killed(second)
    assert copy["error"]["code"] == "in_doubt", copy
    assert turn_2["ok"] and turn_2["replayed"] is False, turn_2
    assert executions.counts()[key] == 2  # turn 1 (cut short) and turn 2
