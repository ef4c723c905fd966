"""Fairness between callers, through a real broker: one caller floods, another keeps its latency.

The rest of the module is what a flood costs the others and what limits it, as
docs/operations.md ("Floods") says: a rate quota answers a flood's excess
`rate_limited` and each of the victim's calls `ok`; a broker that drops requests at its
queue limit (`max_queued_messages`) tells nobody, so a requester without retries ends
with `NoReply`, and one with retries gets every call answered, each run once.

`hog` keeps 32 slow calls in flight and sends again the moment one is answered, as a
flooding client would; `quiet` makes calls one at a time and times them. Without quotas
the hog's calls take every slot and the quiet caller waits behind them in the broker's
queue; with `[callers."*"] max_in_flight` the hog keeps a few slots, the rest of its
calls are answered `rate_limited` at once, and the quiet caller's calls go through. Both runs happen in this test, so the ratio compares like with like.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import (
    SHIPPED_BROKERS,
    BrokerDrops,
    Executions,
    WorkerProcess,
    recording_env,
    shipped_broker,
)
from tests.support.harness import Broker, measured, unique_prefix
from tests.support.mqtt import Caller
from toolbus.client.client import Client, Retry
from toolbus.wire.contracts import Reply
from toolbus.wire.errors import NoReply

HOG_IN_FLIGHT = 32
HOG_HOLD_MS = 1000.0
QUIET_CALLS = 6
CONCURRENCY = 16
FLOOD_CALLS = 300
VICTIM_CALLS = 8  # under the quota's burst: the victim itself is never over it
RATE_QUOTA = {"rate_per_s": 5, "burst": 10}
SMALL_QUEUE = 20  # the broker's per-session queue: a flood of FLOOD_CALLS overflows it
BACKLOG_CALLS = 3000  # a backlog over mosquitto's default queue limit (1 000 per session)
WAIT_S = 150.0  # bounds on whole floods on a loaded 2-core machine, not figures


@pytest.fixture(scope="module")
def roomy_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("mosquitto-fair"), max_queued_messages=100_000)
    broker.start()
    yield broker
    broker.stop()


async def flood_and_time(
    broker: Broker, tmp_path: Path, callers: dict[str, Any]
) -> tuple[list[float], dict[str, int]]:
    """The quiet caller's latencies (ms) while the hog floods, and the hog's outcomes.

    The worker is a process of its own, so the callers' work in this one is not its cost.
    """
    prefix = unique_prefix()
    env = recording_env(
        tmp_path,
        prefix,
        concurrency=str(CONCURRENCY),
        caller_identity="topic",
        callers=json.dumps(callers),
    )
    worker = WorkerProcess(broker.url, env)
    outcomes: dict[str, int] = {}
    quiet_done = asyncio.Event()
    flooding = asyncio.Event()  # as many of the hog's calls answered as it keeps in flight
    await worker.start()
    async with Caller(broker.url) as hog, Caller(broker.url) as quiet:

        async def hog_loop() -> None:
            # A hostile caller: it sends again at once, whatever it is told.
            while not quiet_done.is_set():
                reply, _ = await hog.call(
                    f"{prefix}/call/hog/record",
                    {"arguments": {"key": "hog", "hold_s": HOG_HOLD_MS / 1000}},
                    reply_topic=f"{prefix}/reply/hog/r",
                    timeout_s=120,
                )
                code = reply["error"]["code"] if not reply["ok"] else "ok"
                outcomes[code] = outcomes.get(code, 0) + 1
                if sum(outcomes.values()) >= HOG_IN_FLIGHT:
                    flooding.set()

        hogs = [asyncio.create_task(hog_loop(), name=f"hog-{n}") for n in range(HOG_IN_FLIGHT)]
        await hog.subscribe(f"{prefix}/reply/hog/r")
        async with asyncio.timeout(60):  # the flood is under way before the first timing
            await flooding.wait()
        latencies_ms = []
        try:
            for n in range(QUIET_CALLS):
                started = time.perf_counter()
                reply, _ = await quiet.call(
                    f"{prefix}/call/quiet/echo",
                    {"arguments": {"text": str(n)}},
                    reply_topic=f"{prefix}/reply/quiet/r",
                    timeout_s=120,
                )
                latencies_ms.append((time.perf_counter() - started) * 1000)
                assert reply["ok"] is True
        finally:
            quiet_done.set()
            async with asyncio.timeout(120):
                await asyncio.gather(*hogs)
            await worker.stop()
        return latencies_ms, outcomes


def summary(latencies_ms: list[float]) -> str:
    ordered = sorted(latencies_ms)
    worst = ordered[-1]
    return f"p50 {statistics.median(ordered):.0f} ms, max {worst:.0f} ms"


async def test_a_flooding_caller_cannot_take_the_others_slots(
    roomy_broker: Broker, tmp_path: Path
) -> None:
    unfair, unfair_outcomes = await flood_and_time(roomy_broker, tmp_path / "a", {})
    fair, fair_outcomes = await flood_and_time(
        roomy_broker, tmp_path / "b", {"*": {"max_in_flight": 4}}
    )
    measured(
        f"fairness: one caller keeps {HOG_IN_FLIGHT} calls of {HOG_HOLD_MS:g} ms in flight, "
        f"{CONCURRENCY} slots; "
        f"the other caller's echo without quotas {summary(unfair)}, "
        f"with max_in_flight=4 {summary(fair)}; hog outcomes {unfair_outcomes} -> {fair_outcomes}"
    )
    assert set(unfair_outcomes) == {"ok"}
    assert fair_outcomes["rate_limited"] > fair_outcomes["ok"]
    assert statistics.median(fair) * 3 < statistics.median(unfair)


async def test_a_rate_quota_refuses_a_floods_excess_and_answers_the_victim(
    roomy_broker: Broker, tmp_path: Path
) -> None:
    """FLOOD_CALLS published at once under a caller's rate quota: each answered once, the
    excess `rate_limited` (limit `rate`, a wait to retry after), no more `ok` than the
    bucket holds; the victim's calls, sent meanwhile under the same `*` quota, all `ok`."""
    prefix = unique_prefix()
    env = recording_env(
        tmp_path, prefix, caller_identity="topic", callers=json.dumps({"*": RATE_QUOTA})
    )
    worker = WorkerProcess(roomy_broker.url, env)
    await worker.start()
    reply_topic = f"{prefix}/reply/flooder/r"
    try:
        async with Caller(roomy_broker.url) as flooder, Caller(roomy_broker.url) as victim:
            await flooder.subscribe(reply_topic)
            started = time.monotonic()
            publishing = asyncio.gather(
                *(
                    flooder.publish(
                        f"{prefix}/call/flooder/echo",
                        json.dumps({"id": f"f{n}", "arguments": {"text": "x"}}),
                        response_topic=reply_topic,
                    )
                    for n in range(FLOOD_CALLS)
                )
            )
            victim_codes = []
            for n in range(VICTIM_CALLS):
                reply, _ = await victim.call(
                    f"{prefix}/call/victim/echo",
                    {"arguments": {"text": f"v{n}"}},
                    reply_topic=f"{prefix}/reply/victim/r",
                    timeout_s=WAIT_S,
                )
                victim_codes.append("ok" if reply["ok"] else reply["error"]["code"])
            await publishing
            replies: dict[str, dict[str, Any]] = {}
            async with asyncio.timeout(WAIT_S):
                while len(replies) < FLOOD_CALLS:
                    reply = json.loads((await flooder.next_message(WAIT_S)).payload)
                    assert reply["id"] not in replies, "answered twice"
                    replies[reply["id"]] = reply
            elapsed_s = time.monotonic() - started
    finally:
        await worker.stop()
    codes = Counter("ok" if r["ok"] else r["error"]["code"] for r in replies.values())
    measured(f"a rate quota (5/s, burst 10) against {FLOOD_CALLS} calls at once: {dict(codes)}")
    assert victim_codes == ["ok"] * VICTIM_CALLS
    assert set(codes) == {"ok", "rate_limited"}
    # A token bucket gives out its burst and then its rate, however the flood comes.
    assert codes["ok"] <= RATE_QUOTA["burst"] + RATE_QUOTA["rate_per_s"] * elapsed_s + 1
    for reply in replies.values():
        if not reply["ok"]:
            assert reply["error"]["details"]["limit"] == "rate"
            assert reply["error"]["details"]["retry_after_ms"] > 0


@pytest.fixture
def dropping_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker whose per-session queue a flood overflows; it counts what it drops."""
    (tmp_path / "mosquitto").mkdir()
    broker = Broker(tmp_path / "mosquitto", max_queued_messages=SMALL_QUEUE, sys_interval_s=1)
    broker.start()
    yield broker
    broker.stop()


async def flood_through_clients(
    broker: Broker, tmp_path: Path, retry: Retry, timeout_s: float
) -> tuple[list[Reply | BaseException], list[str], int, Executions, int]:
    """FLOOD_CALLS to the recording tool at once from the flooder's `toolbus.Client`, and
    VICTIM_CALLS echo calls one after another from the victim's, both with `retry`.

    Returns the flooder's outcomes (a reply or what its call raised, in call order), the
    victim's codes, the flooder's re-sends, every execution, and the broker's drops."""
    prefix = unique_prefix()
    # A worker that takes 4 calls at a time, each held 20 ms: slower than the flood.
    env = recording_env(tmp_path, prefix, concurrency="4", caller_identity="topic")
    worker = WorkerProcess(broker.url, env)
    await worker.start()

    def client(caller: str) -> Client:
        return Client(
            broker.url,
            prefix=prefix,
            caller=caller,
            caller_identity="topic",
            retry=retry,
            timeout_s=timeout_s,
        )

    try:
        async with (
            BrokerDrops(broker.url) as drops,
            client("flooder") as flooder,
            client("victim") as victim,
        ):
            flood = asyncio.gather(
                *(
                    flooder.call("record", {"key": f"f{n}", "hold_s": 0.02}, id=f"f{n}")
                    for n in range(FLOOD_CALLS)
                ),
                return_exceptions=True,
            )
            victim_codes = []
            async with asyncio.timeout(WAIT_S):
                for n in range(VICTIM_CALLS):
                    try:
                        await victim.call("echo", {"text": f"v{n}"})
                        victim_codes.append("ok")
                    except NoReply:
                        victim_codes.append("no reply")
                outcomes = await flood
            resent = flooder.resent
            dropped = await drops.beyond(0)  # published within its `sys_interval`, 1 s
    finally:
        await worker.stop()
    executions = Executions(tmp_path / "executions")
    return list(outcomes), victim_codes, resent, executions, dropped


async def test_a_flood_the_broker_drops_in_part_is_answered_by_the_requesters_retries(
    dropping_broker: Broker, tmp_path: Path
) -> None:
    """The broker drops most of the flood at its queue limit and tells nobody; the
    requester sends each unanswered call again under its id until one gets through, so
    every call is answered, each run once, and the victim's calls too."""
    outcomes, victim_codes, resent, executions, dropped = await flood_through_clients(
        dropping_broker, tmp_path, Retry(attempts=40, interval_s=1.0), timeout_s=WAIT_S
    )
    measured(
        f"{FLOOD_CALLS} calls at once through a queue of {SMALL_QUEUE}: broker dropped "
        f"{dropped}, the requester re-sent {resent}, all answered"
    )
    assert dropped > 0 and resent > 0
    assert [o.ok if isinstance(o, Reply) else repr(o) for o in outcomes] == [True] * FLOOD_CALLS
    assert victim_codes == ["ok"] * VICTIM_CALLS
    assert executions.counts() == {f"f{n}": 1 for n in range(FLOOD_CALLS)}


async def test_without_retries_a_call_the_broker_dropped_ends_in_no_reply(
    dropping_broker: Broker, tmp_path: Path
) -> None:
    """Sent once, a call the broker dropped is never answered: the requester raises
    `NoReply` with the call's id at its deadline (plus the reply grace), not a hang;
    what did get through ran once."""
    outcomes, _, resent, executions, dropped = await flood_through_clients(
        dropping_broker, tmp_path, Retry(attempts=1, interval_s=1.0), timeout_s=8.0
    )
    lost = {f"f{n}" for n, o in enumerate(outcomes) if isinstance(o, NoReply)}
    measured(f"the same flood sent once: broker dropped {dropped}, {len(lost)} ended NoReply")
    assert resent == 0 and dropped > 0 and lost
    assert all(isinstance(o, Reply | NoReply) for o in outcomes), outcomes
    assert all(o.id == f"f{n}" for n, o in enumerate(outcomes) if isinstance(o, NoReply))
    assert all(runs == 1 for runs in executions.counts().values())


@pytest.mark.parametrize("shipped", SHIPPED_BROKERS)
async def test_a_shipped_broker_holds_a_floods_backlog_instead_of_dropping_it(
    shipped: str, tmp_path: Path
) -> None:
    """A backlog of BACKLOG_CALLS requests, more than mosquitto's default queue limit of
    1 000 per session, waits in a shipped broker for the worker and is answered in full:
    none is dropped without a word (to the flooder or to a caller queued behind it)."""
    (tmp_path / "mosquitto").mkdir()
    broker = shipped_broker(tmp_path / "mosquitto", shipped)
    broker.start()
    prefix = unique_prefix()
    worker = WorkerProcess(broker.url, recording_env(tmp_path, prefix, concurrency="4"))
    reply_topic = f"{prefix}/reply/flooder/r"
    answered: set[str] = set()
    try:
        await worker.start()
        async with BrokerDrops(broker.url) as drops, Caller(broker.url) as flooder:
            await flooder.subscribe(reply_topic)
            await asyncio.gather(
                *(
                    flooder.publish(
                        f"{prefix}/call/echo",
                        json.dumps({"id": f"f{n}", "arguments": {"text": "x"}}),
                        response_topic=reply_topic,
                    )
                    for n in range(BACKLOG_CALLS)
                )
            )

            async def every_reply() -> None:
                while len(answered) < BACKLOG_CALLS:
                    answered.add(json.loads((await flooder.next_message(WAIT_S)).payload)["id"])

            async with asyncio.timeout(WAIT_S), asyncio.TaskGroup() as group:
                replies = group.create_task(every_reply())
                dropped = group.create_task(drops.beyond(0, timeout_s=WAIT_S))
                # Whichever comes first: every reply, or the broker's count of a drop.
                await asyncio.wait({replies, dropped}, return_when=asyncio.FIRST_COMPLETED)
                lost = dropped.result() if dropped.done() else 0
                replies.cancel()
                dropped.cancel()
    finally:
        await worker.stop()
        broker.stop()
    assert lost == 0, f"{shipped}'s broker dropped {lost} of {BACKLOG_CALLS} requests"
    assert len(answered) == BACKLOG_CALLS
