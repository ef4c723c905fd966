"""Fairness between callers, through a real broker: one caller floods, another keeps its latency.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet import WorkerProcess, recording_env
from tests.harness import Broker, measured, unique_prefix
from tests.mqtt import Caller

HOG_IN_FLIGHT = 32
HOG_HOLD_MS = 1000.0
QUIET_CALLS = 6
CONCURRENCY = 16


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
