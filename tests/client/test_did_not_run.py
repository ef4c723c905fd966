"""`unavailable` says "did not run": true of the request, not only of one delivery (issue 29).

A real mosquitto, a real worker, a real redis-server frozen with SIGSTOP, and
`toolbus.Client` with its retries. While Redis is frozen a claim times out and its
delivery is answered `unavailable` (`details.store`), while the client's re-sends of the
same request wait in the worker's own claims; Redis resumed, a re-send ran the call.
The client used to end the call on the first answer: it raised `Unavailable` and the
call ran anyway (10 of 10), and a program that then sent it again under a new id ran it
twice (10 of 10). Now the client waits for the other copies' answers; and a claim that
comes back after the request's deadline never starts the tool.

The store's timeout is Redis's own `socket_timeout`, set in the `dedup_store` URL (as an
operator may): the stall is a few seconds, not the default 5 s per step.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest_asyncio

from tests.support.harness import Broker, RedisServer, make_settings, measured, running_worker
from tests.support.mqtt import Caller
from toolbus import Client, Retry
from toolbus.backends.local.functions import LocalTool, tool
from toolbus.wire.errors import CallTimeout, Unavailable
from toolbus.worker.service import Worker

CALLS = 10
STORE_TIMEOUT_S = 2.0  # a claim on the frozen Redis fails after this
# Three sends, 0.5 s apart: the re-sends wait in the worker's own claims when the first
# claim fails, one of them still 1 s later.
RETRY = Retry(attempts=3, interval_s=0.5)
SETTLED_S = 20.0  # bound on every wait below


class Runs:
    """What ran, as the tool itself counts it: (call, attempt) -> runs."""

    def __init__(self) -> None:
        self.counted: Counter[tuple[int, int]] = Counter()

    def tool(self) -> LocalTool:
        @tool
        async def counted(n: int, attempt: int = 0) -> dict[str, int]:
            """Counts its runs: the side effect a caller must not get twice."""
            self.counted[(n, attempt)] += 1
            return {"n": n}

        return counted


@pytest_asyncio.fixture
async def stalling(
    broker: Broker, own_redis: RedisServer
) -> AsyncIterator[tuple[Worker, Runs, RedisServer]]:
    """A worker whose dedup store is a Redis of the test's own, answering within 2 s."""
    runs = Runs()
    settings = make_settings(
        broker, dedup_store=f"{own_redis.url}?socket_timeout={STORE_TIMEOUT_S}"
    )
    async with running_worker(settings, [runs.tool()], wait_mcp=False) as worker:
        yield worker, runs, own_redis


async def answers_on(spy: Caller, wanted: int, store_refusals: int = 0) -> tuple[int, int]:
    """Reads replies from the spy until `wanted` replies, or `store_refusals` of them
    `unavailable` for the store, have come: how many of each it read."""
    seen = refused = 0
    async with asyncio.timeout(SETTLED_S):
        while seen < wanted and (not store_refusals or refused < store_refusals):
            reply = json.loads((await spy.messages.get()).payload)
            seen += 1
            error = reply.get("error") or {}
            refused += error.get("code") == "unavailable" and error["details"].get("store", False)
    return seen, refused


async def test_a_call_refused_for_a_stalled_store_is_not_run_by_a_resend_after_it(
    broker: Broker, stalling: tuple[Worker, Runs, RedisServer]
) -> None:
    """Ten calls while Redis is frozen. The program does what the audit's did: on
    `Unavailable` it sends the call again, under a new id (the docs now advise the same id,
    which is safe either way; a new id shows whether `Unavailable` was true). Counted by the tool: calls
    that raised `Unavailable` and then ran anyway, and calls that ran twice (10/10 and
    10/10 before; 0 and 0 now: each call ran exactly once, and the program knew)."""
    worker, runs, redis = stalling
    assert redis.process is not None
    prefix = worker.topics.prefix
    raised: set[int] = set()

    async def program(client: Client, n: int) -> None:
        try:
            await client.call("counted", {"n": n}, timeout_s=15)
        except Unavailable:
            raised.add(n)
            await client.call("counted", {"n": n, "attempt": 1}, timeout_s=15)

    async with Caller(broker.url) as spy, Client(broker.url, prefix=prefix, retry=RETRY) as client:
        await spy.subscribe(f"{prefix}/reply/#")  # every answer to every copy
        redis.process.send_signal(signal.SIGSTOP)
        try:
            calls = [
                asyncio.create_task(program(client, n), name=f"call-{n}") for n in range(CALLS)
            ]
            # Every first claim has failed and been answered: the re-sends still wait.
            seen, _ = await answers_on(spy, CALLS * RETRY.attempts, store_refusals=CALLS)
        finally:
            redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(SETTLED_S):
            await asyncio.gather(*calls)
        # Every copy answered: nothing is left to run later.
        await answers_on(spy, client.sent - seen)
    ran_after_raising = sum(runs.counted[(n, 0)] > 0 for n in raised)
    ran_twice = sum(runs.counted[(n, 0)] + runs.counted[(n, 1)] > 1 for n in range(CALLS))
    measured(
        f"Redis frozen past a claim ({STORE_TIMEOUT_S:g} s), {CALLS} calls: raised Unavailable "
        f"{len(raised)}, of them ran anyway {ran_after_raising}; "
        f"ran twice with a retry under a new id {ran_twice}"
    )
    assert (ran_after_raising, ran_twice) == (0, 0)
    assert all(runs.counted[(n, 0)] + runs.counted[(n, 1)] == 1 for n in range(CALLS))


async def test_a_claim_that_comes_back_past_the_deadline_does_not_start_the_tool(
    broker: Broker, stalling: tuple[Worker, Runs, RedisServer]
) -> None:
    """Redis frozen past a request's deadline, and back before the claim times out: the
    claim comes back `fresh` for a request whose sender has stopped waiting (and may have
    concluded from another copy's answer that nothing ran). The tool is not started
    (it used to be, and cancelled at once: `timeout`, recorded for good); the call is
    answered `timeout` with `details.expired`, and its id is left free."""
    worker, runs, redis = stalling
    assert redis.process is not None
    ident = uuid.uuid4().hex
    loop = asyncio.get_running_loop()
    async with Client(broker.url, prefix=worker.topics.prefix, retry=Retry(attempts=1)) as client:
        redis.process.send_signal(signal.SIGSTOP)
        try:
            sent_at = loop.time()
            calling = asyncio.create_task(
                client.call("counted", {"n": 1}, timeout_s=1, id=ident), name="late"
            )
            # The fault: a stall past the request's 1 s deadline (its expiry, counted from
            # the send), shorter than the claim's timeout (2 s): half a second from each.
            await asyncio.sleep(max(0.0, sent_at + 1.5 - loop.time()))
        finally:
            redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(SETTLED_S):
            (refused,) = await asyncio.gather(calling, return_exceptions=True)
        assert sum(runs.counted.values()) == 0
        assert isinstance(refused, CallTimeout) and refused.details.get("expired") is True
        again = await client.call("counted", {"n": 1}, timeout_s=10, id=ident)
    assert again.ok and not again.replayed  # released: the id runs when sent again
    assert sum(runs.counted.values()) == 1
