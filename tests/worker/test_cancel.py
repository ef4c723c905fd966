"""Cancellation behind `$share`, from the outside: a real mosquitto, `toolbus serve`
processes sharing the request subscription and a real Redis, the recording tool (every
run written to a file) and callers that cancel on `{prefix}/cancel`.

Every worker hears every cancel (a plain subscription), so whichever runs the call
cancels it; one that comes before its call is remembered in the dedup store, and the
call, wherever it lands, is answered `cancelled` without running.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli import cli_env
from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer, measured
from tests.support.mqtt import Caller
from toolbus.client.client import Client
from toolbus.worker.exit_codes import EXIT_INTERRUPTED

CALLER = "alice"


async def _pool(
    broker: Broker, redis_server: RedisServer, tmp_path: Path, workers: int = 2
) -> tuple[str, list[WorkerProcess]]:
    prefix = f"cancel{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, concurrency="16", dedup_store=redis_server.url)
    pool = [WorkerProcess(broker.url, env) for _ in range(workers)]
    await asyncio.gather(*(worker.start() for worker in pool))
    return prefix, pool


async def _stop(pool: list[WorkerProcess]) -> None:
    await asyncio.gather(*(worker.stop() for worker in pool))


def _call(ident: str, hold_s: float, caller: str | None = CALLER) -> str:
    body: dict[str, Any] = {"id": ident, "arguments": {"key": ident, "hold_s": hold_s}}
    if caller is not None:
        body["caller"] = caller
    return json.dumps(body)


def _cancel(ident: str, caller: str | None = CALLER, **more: str) -> str:
    return json.dumps({"id": ident, **({"caller": caller} if caller else {}), **more})


async def _replies(caller: Caller, topic: str, count: int) -> dict[str, list[dict[str, Any]]]:
    """Every reply on `topic` by id, until `count` ids answered, then whatever else comes
    within a short bound (a second final reply would)."""
    got: dict[str, list[dict[str, Any]]] = {}
    async with asyncio.timeout(45):
        while len(got) < count:
            message = await caller.next_message()
            if message.topic.value == topic:
                reply = json.loads(message.payload)
                got.setdefault(str(reply["id"]), []).append(reply)
    while True:  # a duplicate would come right behind: a bounded look, not a sync
        try:
            message = await caller.next_message(timeout_s=0.5)
        except TimeoutError:
            return got
        if message.topic.value == topic:
            reply = json.loads(message.payload)
            got.setdefault(str(reply["id"]), []).append(reply)


async def test_a_hundred_calls_cancelled_at_random_moments(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two workers on `$share`, 100 calls each cancelled at a random moment (some before
    the call is even sent): each gets exactly one final reply, `cancelled` or its result,
    and no call answered `cancelled` with `started: false` ever ran."""
    prefix, pool = await _pool(broker, redis_server, tmp_path)
    executions = Executions(tmp_path / "executions")
    reply_topic = f"{prefix}/reply/{CALLER}"
    rng = random.Random(31)
    calls = 100
    try:
        async with Caller(broker.url) as caller, Caller(broker.url) as canceller:
            await caller.subscribe(reply_topic)

            async def one(n: int) -> None:
                ident = f"c{n}"
                hold_s, cancel_after_s = rng.uniform(0.2, 1.0), rng.uniform(-0.1, 1.2)
                call = caller.publish(
                    f"{prefix}/call/record", _call(ident, hold_s), response_topic=reply_topic
                )
                if cancel_after_s < 0:  # the cancel goes first
                    await canceller.publish(f"{prefix}/cancel", _cancel(ident))
                    await call
                    return
                await call
                await asyncio.sleep(cancel_after_s)  # the random moment itself, not a sync
                await canceller.publish(f"{prefix}/cancel", _cancel(ident))

            collecting = asyncio.create_task(_replies(caller, reply_topic, calls))
            await asyncio.gather(*(one(n) for n in range(calls)))
            replies = await collecting
    finally:
        await _stop(pool)
    assert sorted(replies) == sorted(f"c{n}" for n in range(calls))
    assert all(len(each) == 1 for each in replies.values()), {
        i: r for i, r in replies.items() if len(r) > 1
    }
    finals = {ident: each[0] for ident, each in replies.items()}
    runs = executions.counts()
    not_started = [
        i
        for i, r in finals.items()
        if not r["ok"]
        and r["error"]["code"] == "cancelled"
        and not r["error"]["details"]["started"]
    ]
    started = [
        i
        for i, r in finals.items()
        if not r["ok"] and r["error"]["code"] == "cancelled" and r["error"]["details"]["started"]
    ]
    results = [i for i, r in finals.items() if r["ok"]]
    assert not [i for i in not_started if runs[i]], "a call said not started, yet it ran"
    assert max(runs.values(), default=0) <= 1
    assert len(not_started) + len(started) + len(results) == calls, finals
    assert started and not_started  # the moments hit both: while running, and before
    for ident in started:
        details = finals[ident]["error"]["details"]
        assert details["cause"] == "caller" and details["in_doubt"] is False  # a local tool
    measured(
        f"100 calls over two workers, cancelled at random moments: {len(started)} cancelled "
        f"while running, {len(not_started)} before starting (none ran), {len(results)} "
        "finished first; one final reply each"
    )


async def test_cancel_to_reply_time(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The time from a cancel's publish to the `cancelled` reply, for 100 calls running
    on two workers (p50/p99, printed)."""
    prefix, pool = await _pool(broker, redis_server, tmp_path)
    reply_topic = f"{prefix}/reply/{CALLER}"
    times: list[float] = []
    try:
        async with Caller(broker.url) as caller:
            await caller.subscribe(reply_topic)
            for batch in range(5):  # 20 at a time: every one runs when cancelled
                idents = [f"t{batch}-{n}" for n in range(20)]
                for ident in idents:
                    await caller.publish(
                        f"{prefix}/call/record", _call(ident, 30.0), response_topic=reply_topic
                    )
                await _all_started(pool, idents)
                sent: dict[str, float] = {}
                for ident in idents:
                    sent[ident] = time.monotonic()
                    await caller.publish(f"{prefix}/cancel", _cancel(ident))
                async with asyncio.timeout(20):
                    while sent:
                        message = await caller.next_message()
                        reply = json.loads(message.payload)
                        assert reply["error"]["code"] == "cancelled", reply
                        assert reply["error"]["details"]["started"] is True
                        times.append(time.monotonic() - sent.pop(reply["id"]))
    finally:
        await _stop(pool)
    times.sort()
    p50, p99 = statistics.median(times), times[int(len(times) * 0.99) - 1]
    measured(
        f"cancel to reply over {len(times)} running calls on two workers: "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
    )
    assert p99 < 2.0


async def _all_started(pool: list[WorkerProcess], idents: list[str]) -> None:
    """Until the pool has started every one of `idents` (each worker's tool log lines)."""
    line = asyncio.Event()
    for worker in pool:
        worker.new_line = line
    async with asyncio.timeout(20):
        while True:
            line.clear()
            if set(idents) <= set().union(*(worker.started for worker in pool)):
                return
            await line.wait()


@pytest.mark.parametrize("shape", ["named", "v311_anonymous", "provider"])
async def test_early_cancel_and_a_retry(
    broker: Broker, redis_server: RedisServer, tmp_path: Path, shape: str
) -> None:
    """A cancel that comes before its call (here: sent first) is remembered: the call is
    answered `cancelled` (`started: false`) without running, on whichever worker it
    lands; the same request sent again replays that answer. For a named caller, a 3.1.1
    anonymous one (`reply_to` + `id`: the reply topic makes the call its own) and a
    provider-shaped request (the provider's tool-call id under the caller)."""
    prefix, pool = await _pool(broker, redis_server, tmp_path)
    executions = Executions(tmp_path / "executions")
    ident = f"early-{shape}"
    reply_topic = f"{prefix}/reply/{CALLER}/{shape}"
    try:
        async with Caller(broker.url, v5=shape != "v311_anonymous") as caller:
            await caller.subscribe(reply_topic)
            call, cancel, props = _shaped(shape, ident, reply_topic)
            await caller.publish(f"{prefix}/cancel", cancel, **props)
            # Remembered before the call is sent: else the call may come first (two
            # connections, no order between them) and run, as it should then.
            await _logged(pool, f"cancel of {ident}: remembered", len(pool))
            answers = []
            for _ in range(2):
                await caller.publish(f"{prefix}/call", call, **props)
                async with asyncio.timeout(15):
                    message = await caller.next_message()
                answers.append(json.loads(message.payload))
    finally:
        await _stop(pool)
    for n, answer in enumerate(answers):
        reply = _call_reply(answer)
        assert reply["error"]["code"] == "cancelled", answer
        assert reply["error"]["details"] == {"started": False, "in_doubt": False, "cause": "caller"}
        assert bool(reply.get("replayed")) == (n == 1), answer
    assert executions.counts()[ident] == 0


async def _logged(pool: list[WorkerProcess], text: str, count: int = 1) -> None:
    """Until `count` workers of the pool have logged `text`."""
    line = asyncio.Event()
    for worker in pool:
        worker.new_line = line
    async with asyncio.timeout(20):
        while True:
            line.clear()
            if sum(any(text in seen for seen in worker.log) for worker in pool) >= count:
                return
            await line.wait()


def _shaped(shape: str, ident: str, reply_topic: str) -> tuple[str, str, dict[str, Any]]:
    """The call and its cancel, as each kind of caller sends them."""
    arguments = {"key": ident, "hold_s": 0.0}
    if shape == "named":
        call = json.dumps({"id": ident, "tool": "record", "arguments": arguments, "caller": CALLER})
        return call, _cancel(ident), {"response_topic": reply_topic}
    if shape == "v311_anonymous":
        call = json.dumps(
            {"id": ident, "tool": "record", "arguments": arguments, "reply_to": reply_topic}
        )
        return call, _cancel(ident, None, reply_to=reply_topic), {}
    provided = {
        "tool_calls": [
            {
                "id": ident,
                "type": "function",
                "function": {"name": "record", "arguments": json.dumps(arguments)},
            }
        ],
        "toolbus": {"caller": CALLER, "id": f"msg-{ident}"},
    }
    return json.dumps(provided), _cancel(ident), {"response_topic": reply_topic}


def _call_reply(answer: dict[str, Any]) -> dict[str, Any]:
    """The call's own reply: ours, or the one in a provider-shaped answer's `results`."""
    if "results" in answer:
        (inner,) = answer["results"]
        assert isinstance(inner, dict)
        return inner
    return answer


async def test_another_callers_cancel_is_a_no_op(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """bob cancels alice's id: alice's call runs to its result; bob's own call under the
    same id, sent later, is the one the cancel named."""
    prefix, pool = await _pool(broker, redis_server, tmp_path, workers=1)
    executions = Executions(tmp_path / "executions")
    reply_topic = f"{prefix}/reply/{CALLER}"
    try:
        async with Caller(broker.url) as caller:
            await caller.subscribe(reply_topic)
            await caller.publish(
                f"{prefix}/call/record", _call("same", 0.5), response_topic=reply_topic
            )
            await caller.publish(f"{prefix}/cancel", _cancel("same", "bob"))
            await caller.publish(f"{prefix}/cancel/bob", _cancel("same"))
            async with asyncio.timeout(15):
                reply = json.loads((await caller.next_message()).payload)
    finally:
        await _stop(pool)
    assert reply["ok"] is True, reply
    assert executions.counts()["same"] == 1


async def test_a_client_task_cancelled_cancels_its_call(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """`toolbus.Client`: the task awaiting `call` cancelled, the client publishes the
    call's cancel, and the worker running it answers `cancelled` (`started: true`),
    seen here by a listener on the client's reply topic (the client stopped waiting)."""
    prefix, pool = await _pool(broker, redis_server, tmp_path)
    try:
        async with (
            Client(broker.url, prefix=prefix, caller=CALLER) as client,
            Caller(broker.url) as listener,
        ):
            await listener.subscribe(client.reply_topic)
            call = asyncio.create_task(client.call("record", {"key": "cl1", "hold_s": 30}))
            await _all_started(pool, ["cl1"])
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            async with asyncio.timeout(10):
                reply = json.loads((await listener.next_message()).payload)
    finally:
        await _stop(pool)
    assert reply["error"]["code"] == "cancelled"
    assert reply["error"]["details"]["started"] is True


async def test_ctrl_c_on_toolbus_call_cancels_the_call(
    broker: Broker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """`toolbus call` interrupted (SIGINT) while the call runs: the call is cancelled at
    the worker (an anonymous client: the cancel names its reply topic) and the command
    exits 130."""
    prefix, pool = await _pool(broker, redis_server, tmp_path, workers=1)
    env = cli_env(prefix)
    try:
        async with Caller(broker.url) as listener:
            await listener.subscribe(f"{prefix}/reply/#")
            command = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "toolbus", "call", "record", "key=cli1", "hold_s=30"),
                *("--broker", broker.url),
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            await _all_started(pool, ["cli1"])
            command.send_signal(signal.SIGINT)
            async with asyncio.timeout(15):
                _, err = await command.communicate()
                reply = json.loads((await listener.next_message()).payload)
    finally:
        await _stop(pool)
    assert command.returncode == EXIT_INTERRUPTED, err
    assert reply["error"]["code"] == "cancelled"
    assert reply["error"]["details"]["started"] is True
