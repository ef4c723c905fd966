"""Oversize requests through a real mosquitto cost only their refusal (issue 24.2).

The audit's attacks: one 1 MB request with 60 000 user properties froze every caller
for 9.3 s (paho parses them in quadratic time on the event loop), and 28 requests of
100 MB took the worker to 3.4 GiB. Now the worker asks the broker for a Maximum Packet
Size (a larger request is dropped for it, never read), and user properties over the
bounds are refused with a code, unparsed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.calls.test_oversize import counted
from tests.support.harness import Broker, measured
from tests.support.mqtt import Caller, correlation_of
from tests.support.packets import properties
from tests.support.processes import RUN_BOUND_S, Serve, serve_env
from toolbus.wire.messages import MAX_USER_PROPERTIES, MAX_USER_PROPERTY_BYTES

# A victim's echo is answered within this while an attacker's request is in the broker:
# milliseconds when the request costs only its refusal; on 03d6bec the worker parsed
# its properties for tens of seconds first.
VICTIM_BOUND_S = 5.0
# A flood of payloads this large may grow a worker's peak memory by at most this much:
# a worker that received them would hold several at once.
FLOOD_REQUESTS, FLOOD_PAYLOAD_BYTES = 8, 16 * 1024 * 1024
PEAK_GROWTH_BOUND_BYTES = 48 * 1024 * 1024
BIN = Path(sys.executable).parent  # the bundled config runs `toolbus demo-server`
ECHO_TOPIC = "toolbus/call/echo"  # the bundled config's prefix


def echo(text: str) -> dict[str, Any]:
    return {"arguments": {"text": text}}


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """No `max_packet_size` of the broker's own: only the worker's bound stands."""
    broker = Broker(tmp_path_factory.mktemp("mosquitto-oversize"))
    broker.start()
    yield broker
    broker.stop()


@pytest_asyncio.fixture(scope="module")
async def serve(own_broker: Broker) -> AsyncIterator[Serve]:
    """`toolbus serve` with the bundled config (topic prefix `toolbus`), in a process of
    its own: a worker frozen parsing must not freeze the clock the test reads."""
    env = serve_env()
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    async with Serve(env, "--broker", own_broker.url) as served:
        await served.wait_for("subscribed to")
        yield served


async def send_raw(
    attacker: Caller, topic: str, payload: bytes, reply_topic: str, user_properties: int
) -> None:
    """A request whose user properties paho could not build in reasonable time."""
    props = properties(
        response_topic=reply_topic, correlation=b"attack", user_properties=user_properties
    )
    await attacker.client.publish(topic, payload, qos=1, properties=props)


async def test_an_oversize_request_never_reaches_the_worker_and_costs_a_victim_nothing(
    serve: Serve, own_broker: Broker
) -> None:
    reply = "toolbus/reply/attacker"
    async with Caller(own_broker.url) as attacker, Caller(own_broker.url) as victim:
        await attacker.subscribe(reply)
        warm, _ = await victim.call(ECHO_TOPIC, echo("warm"), reply_topic="toolbus/reply/victim")
        assert warm["ok"], warm
        # 300 KB of payload and 40 000 user properties (240 KB): over the packet bound
        await send_raw(attacker, ECHO_TOPIC, b"x" * 300_000, reply, 40_000)
        started = time.monotonic()
        answer, _ = await victim.call(
            ECHO_TOPIC, echo("hi"), reply_topic="toolbus/reply/victim", timeout_s=120
        )
        waited_s = time.monotonic() - started
        assert answer["ok"], answer
        measured(f"a victim's echo behind an oversize request: {waited_s * 1000:.0f} ms")
        assert waited_s < VICTIM_BOUND_S
        # Sent after the oversize one on the same connection: the broker delivers in order,
        # and the worker answers (or dead-letters) every request it reads.
        marker, _ = await attacker.call(ECHO_TOPIC, echo("m"), reply_topic=reply, timeout_s=120)
        assert marker["ok"], marker
        assert attacker.unclaimed() == []  # the oversize request was never answered: never read


@pytest.mark.parametrize(
    ("count", "value"),
    [
        (MAX_USER_PROPERTIES + 1, b""),
        (5_000, b"v"),  # 35 KB: well within the packet bound
        (40_000, b""),  # 240 KB: within it too; read no further than the 65th
        (1, b"v" * MAX_USER_PROPERTY_BYTES),
    ],
)
async def test_a_request_with_user_properties_over_the_bounds_is_refused_with_the_code(
    serve: Serve, own_broker: Broker, count: int, value: bytes
) -> None:
    """`count` and `size_bytes` are what the worker read up to the first property past a
    bound (it reads no further): the request held at least that many."""
    reply = f"toolbus/reply/props-{count}"
    async with Caller(own_broker.url) as attacker:
        await attacker.subscribe(reply)
        props = properties(
            response_topic=reply, correlation=b"attack", user_properties=count, value=value
        )
        body = json.dumps(echo("x")).encode()
        await attacker.client.publish(ECHO_TOPIC, body, qos=1, properties=props)
        message = await attacker.next_message()
        assert correlation_of(message) == b"attack"
        answer = json.loads(message.payload)
        assert answer["error"]["code"] == "bad_request", answer
        details = answer["error"]["details"]
        assert details["reason"] == "user_properties_too_large"
        read = counted(count, value)
        assert details == {
            **details,
            "limit_count": MAX_USER_PROPERTIES,
            "count": read.count,
            "limit_bytes": MAX_USER_PROPERTY_BYTES,
            "size_bytes": read.size_bytes,
        }
        assert read.count <= MAX_USER_PROPERTIES + 1
        after, _ = await attacker.call(ECHO_TOPIC, echo("after"), reply_topic=reply)
        assert after["ok"], after  # the worker goes on answering the same caller


async def test_correlation_data_after_the_first_property_past_a_bound_is_not_read(
    serve: Serve, own_broker: Broker
) -> None:
    """MQTT allows Correlation Data after the user properties (paho writes it before):
    over the bounds, the refusal comes to the Response Topic without it."""
    reply = "toolbus/reply/props-late-correlation"
    async with Caller(own_broker.url) as attacker:
        await attacker.subscribe(reply)
        props = properties(
            response_topic=reply, correlation=b"late", user_properties=100, correlation_last=True
        )
        await attacker.client.publish(
            ECHO_TOPIC, json.dumps(echo("x")).encode(), qos=1, properties=props
        )
        message = await attacker.next_message()
        assert correlation_of(message) is None
        answer = json.loads(message.payload)
        assert answer["error"]["details"]["reason"] == "user_properties_too_large", answer
        assert answer["error"]["details"]["count"] == MAX_USER_PROPERTIES + 1


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in KiB, from /proc/<pid>/status."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {
        k: int(v.split()[0])
        for k, _, v in (line.partition(":") for line in lines)
        if k in {"VmRSS", "VmHWM"}
    }


async def test_a_large_payload_flood_does_not_grow_the_workers_memory(
    serve: Serve, own_broker: Broker
) -> None:
    reply = "toolbus/reply/flood"
    async with Caller(own_broker.url) as attacker:
        await attacker.subscribe(reply)
        first, _ = await attacker.call(ECHO_TOPIC, echo("before"), reply_topic=reply)
        assert first["ok"], first
        before = memory_kib(serve.pid)
        for _ in range(FLOOD_REQUESTS):
            await send_raw(attacker, ECHO_TOPIC, b"x" * FLOOD_PAYLOAD_BYTES, reply, 0)
        # Sent after the flood on the same connection: by its answer the worker has had
        # every flood request it would ever get.
        last, _ = await attacker.call(
            ECHO_TOPIC, echo("after"), reply_topic=reply, timeout_s=RUN_BOUND_S
        )
        assert last["ok"], last
        after = memory_kib(serve.pid)
        measured(
            f"worker memory, {FLOOD_REQUESTS} requests of {FLOOD_PAYLOAD_BYTES >> 20} MiB: "
            f"RSS {before['VmRSS'] >> 10} -> {after['VmRSS'] >> 10} MiB, "
            f"peak {before['VmHWM'] >> 10} -> {after['VmHWM'] >> 10} MiB"
        )
        assert (after["VmHWM"] - before["VmHWM"]) * 1024 < PEAK_GROWTH_BOUND_BYTES
        assert attacker.unclaimed() == []  # none of the flood was read, so none answered
