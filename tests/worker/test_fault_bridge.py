"""Two mosquittos bridged with MQTT 5, the bridge cut and restored mid-load, with real
processes: callers (a retrying `toolbus.Client`) on mosquitto A, the `$share` pool (two
`toolbus serve` workers sharing a Redis dedup store) on mosquitto B, whose bridge carries
the requests from A and the replies back (Response Topic and Correlation Data intact:
`bridge_protocol_version mqttv50`). The bridge reaches A through a TCP relay the test
controls (tests/support/relay.py): `cut()` closes it and refuses it, `restore()` lets it
connect again.

The bridge keeps its session on A (`cleansession false`): what callers publish while it
is down waits on A for it, and replies published on B wait there, so a re-send and its
first copy may both arrive; dedup answers the second from the first's record. Counted:
lost 0, executed twice 0, in_doubt (allowed).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from tests.support.fleet import Executions, WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer, measured
from tests.support.mqtt import Caller
from tests.support.relay import Relay
from tests.support.steady_load import CALL_TIMEOUT_S, RETRY, Resends, SteadyLoad
from toolbus.client.client import Client
from toolbus.config import BrokerUrl

BRIDGE = "to-a"
# mosquitto publishes its bridge's state on the local broker, retained: 1 up, 0 down
# (on `$SYS/broker/connection/{remote_clientid}/state`).
BRIDGE_STATE = f"$SYS/broker/connection/{BRIDGE}/state"
WAIT_S = 20.0


def bridge_conf(remote_port: int, prefix: str) -> str:
    """B's bridge to A (mosquitto.conf(5)): requests and cancels in, replies and statuses
    out, QoS 1, over MQTT 5, its session kept on A; reconnecting 1 to 2 s after a loss
    (a backoff: mosquitto 2.0.11 given one value, `restart_timeout 1`, waited 5 s)."""
    return (
        f"connection {BRIDGE}\n"
        f"address 127.0.0.1:{remote_port}\n"
        f"remote_clientid {BRIDGE}\n"
        "notifications_local_only true\n"
        "bridge_protocol_version mqttv50\n"
        "cleansession false\n"
        "restart_timeout 1 2\n"
        "keepalive_interval 5\n"
        f"topic {prefix}/call/# in 1\n"
        f"topic {prefix}/cancel/# in 1\n"
        f"topic {prefix}/reply/# out 1\n"
        f"topic {prefix}/status/# out 1\n"
    )


async def bridge_is(watch: Caller, state: bytes, timeout_s: float = WAIT_S) -> None:
    """Until mosquitto B says its bridge is up (`b"1"`) or down (`b"0"`)."""
    async with asyncio.timeout(timeout_s):
        while (await watch.next_message(timeout_s)).payload != state:
            pass


async def test_the_bridge_between_callers_and_pool_cut_and_restored_mid_load(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = f"br{uuid.uuid4().hex[:8]}"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    callers_side, pool_side = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    callers_side.start()
    relay = Relay("127.0.0.1", callers_side.port)
    await relay.start()
    pool_side.config.write_text(pool_side.config.read_text() + bridge_conf(relay.port, prefix))
    pool_side.start()
    env = recording_env(tmp_path, prefix, concurrency="16", dedup_store=redis_server.url)
    pool = [
        WorkerProcess(pool_side.url, {**env, "TOOLBUS_WORKER_ID": f"{prefix}-w{n}"}) for n in (1, 2)
    ]
    executions = Executions(tmp_path / "executions")
    try:
        async with Caller(pool_side.url) as watch:
            await watch.subscribe(BRIDGE_STATE)
            await bridge_is(watch, b"1")
            await asyncio.gather(*(w.start() for w in pool))
            resends = Resends()
            async with Client(
                BrokerUrl.from_url(callers_side.url), prefix=prefix, retry=RETRY, on_resend=resends
            ) as client:
                load = SteadyLoad(client, prefix, tag="b", hold_s=0.05)
                sending = asyncio.create_task(load.run(in_flight=16), name="load")
                await load.reached(100)
                resent_before = resends.count
                await relay.cut()
                began = time.monotonic()
                await bridge_is(watch, b"0")
                await resends.beyond(resent_before)  # a caller heard nothing, and re-sent
                await relay.restore()
                cut_s = time.monotonic() - began
                await bridge_is(watch, b"1")
                back_s = time.monotonic() - began
                await load.reached(len(load.replies) + 50)  # answers cross again
                load.stop()
                async with asyncio.timeout(CALL_TIMEOUT_S + 10):
                    await sending
    finally:
        await asyncio.gather(*(w.stop() for w in pool))
        await relay.stop()
        pool_side.stop()
        callers_side.stop()

    load.report(
        f"MQTT 5 bridge (callers on mosquitto A, $share pool of 2 on B) cut for {cut_s:.1f} s "
        f"mid-load, up again {back_s:.1f} s after the cut",
        executions,
    )
    assert set(load.codes()) <= {"ok", "in_doubt"}, load.codes()
    measured(f"bridge cut: by worker {[len(executions.by(w.pid)) for w in pool]} executions")
