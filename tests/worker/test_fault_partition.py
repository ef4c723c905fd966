"""A partition between one worker and its broker while calls run on it, with real
processes: a mosquitto, a redis-server (the shared dedup store), two `toolbus serve`
workers, one of them connected to the broker through a TCP relay the test controls
(tests/support/relay.py), and a retrying `toolbus.Client` load to the recording tool.

Mid-load the relay blackholes the worker's connections (TCP sees nothing: no reset, no
close) until the worker's keepalive gives up on them, then heals. The calls the cut-off
worker held are answered by the caller's re-sends (on the other worker, from the shared
store, or by the cut-off worker once back) or `in_doubt`, never run twice; and the worker
rejoins: it runs calls again after the heal. Both dispatch modes: `$share` (mosquitto's
shared subscription) and `dispatch = "store"` (Redis decides who runs a call).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer, measured
from tests.support.relay import Relay
from tests.support.steady_load import CALL_TIMEOUT_S, RETRY, SteadyLoad
from toolbus.client.client import Client
from toolbus.config import BrokerUrl

# The cut-off worker's MQTT keepalive (`keepalive_s`; 60 by default): it pings a broker
# silent this long and drops the connection after as long again without an answer, so
# it notices the partition within about 2 s (mosquitto gives up on it after 1.5 s).
KEEPALIVE_S = 1
WAIT_S = 20.0


async def logged(worker: WorkerProcess, text: str, timeout_s: float = WAIT_S) -> None:
    """Until one of the worker's log lines since `worker.log` was last emptied has `text`."""
    async with asyncio.timeout(timeout_s):
        while not any(text in line for line in worker.log):
            worker.new_line.clear()
            await worker.new_line.wait()


async def ran_again(worker: WorkerProcess, before: set[str], timeout_s: float = WAIT_S) -> str:
    """Until the worker starts a call that is not in `before`: its key."""
    async with asyncio.timeout(timeout_s):
        while not (new := worker.started - before):
            worker.new_line.clear()
            await worker.new_line.wait()
    return sorted(new)[0]


@pytest.mark.parametrize("dispatch", ["shared", "store"])
async def test_a_worker_partitioned_from_its_broker_mid_load(
    broker: Broker, redis_server: RedisServer, tmp_path: Path, dispatch: str
) -> None:
    prefix = f"pt{uuid.uuid4().hex[:8]}"
    env = recording_env(
        tmp_path,
        prefix,
        concurrency="16",
        dedup_store=redis_server.url,
        dispatch=dispatch,
        reconnect_max_delay_s="1",
    )
    relay = Relay("127.0.0.1", broker.port)
    await relay.start()
    cut_off = WorkerProcess(
        relay.url,
        {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w1", "TOOLBUS_KEEPALIVE_S": str(KEEPALIVE_S)},
    )
    direct = WorkerProcess(broker.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w2"})
    executions = Executions(tmp_path / "executions")
    await asyncio.gather(cut_off.start(), direct.start())
    try:
        async with Client(BrokerUrl.from_url(broker.url), prefix=prefix, retry=RETRY) as client:
            load = SteadyLoad(client, prefix, tag="p", hold_s=0.05)
            sending = asyncio.create_task(load.run(in_flight=16), name="load")
            await load.reached(100)
            assert cut_off.started, "the worker behind the relay ran nothing before the fault"
            held_at_partition = len(cut_off.started)
            cut_off.log = []
            await relay.partition()
            began, sent_before = time.monotonic(), load.sent
            await logged(cut_off, "broker connection lost")  # its keepalive gave up
            noticed_s = time.monotonic() - began
            # While the partition lasts, every call sent before it is answered: those the
            # cut-off worker held too, by their re-sends on the other worker.
            await load.ended(sent_before, timeout_s=WAIT_S)
            answered_cut_off_s = time.monotonic() - began
            before_heal = set(cut_off.started)
            cut_off.log = []
            healed = await relay.heal()
            partitioned_s = time.monotonic() - began
            await logged(cut_off, "subscribed to")  # reconnected, through the relay
            rejoined_s = time.monotonic() - began
            key = await ran_again(cut_off, before_heal)  # and runs calls again
            load.stop()
            async with asyncio.timeout(CALL_TIMEOUT_S + 10):
                await sending
    finally:
        await asyncio.gather(cut_off.stop(), direct.stop())
        await relay.stop()

    load.report(
        f"partition ({dispatch} dispatch): one of 2 workers cut off from mosquitto for "
        f"{partitioned_s:.1f} s mid-load (noticed after {noticed_s:.1f} s, its calls answered "
        f"after {answered_cut_off_s:.1f} s, rejoined "
        f"{rejoined_s:.1f} s after the cut; {held_at_partition} calls run there before)",
        executions,
    )
    measured(f"partition ({dispatch}): relay heal {healed}")
    assert healed["closed"] >= 1  # the worker (and the broker) gave up on the cut connections
    assert set(load.codes()) <= {"ok", "in_doubt"}, load.codes()
    assert key in load.replies  # its run after the heal was answered
