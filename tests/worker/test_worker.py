"""The worker end to end: real mosquitto, real demo MCP server, v5 and 3.1.1 callers.

What the pipeline decides (each error code, dead letters, 3.1.1 bodies, traces) is
tested without a broker in test_pipeline.py; here is what only a broker shows:
properties on the wire, concurrency bounds, drain at stop, reconnects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import (
    DEMO_SERVER,
    Broker,
    free_port,
    make_settings,
    measured,
    running_worker,
)
from tests.support.logwait import watching
from tests.support.mqtt import Caller, call_topic, correlation_of, reply_topic_for
from tests.support.tools import Probe, probe_tools, quits
from toolbus.config import Settings
from toolbus.worker.service import Worker
from toolbus.worker.wiring import build_worker

STOPPED_AT_ONCE_S = 10.0  # a third of the publish timeout these tests set


async def device_state(caller: Caller, worker: Worker, name: str) -> dict[str, Any]:
    reply = await caller.call_tool(worker.topics, "get_device_sensor_data", {"deviceName": name})
    assert reply["ok"], reply
    return dict(reply["result"]["structured"])


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
async def test_turn_on_switch_one(broker: Broker, demo_worker: Worker, v5: bool) -> None:
    """The headline case: snake_case arguments reach the camelCase demo server renamed."""
    device = "Switch One" if v5 else "Switch Two"
    async with Caller(broker.url, v5=v5) as caller:
        before = await device_state(caller, demo_worker, device)
        assert before["state"] == "off"
        reply, message = await caller.call(
            call_topic(demo_worker.topics),
            {"tool": "control_zwave_device", "arguments": {"device_name": device, "command": "on"}},
            reply_topic=reply_topic_for(demo_worker.topics),
        )
        assert reply["ok"] is True, reply
        assert reply["tool"] == "control_zwave_device"
        # What the server itself says it received:
        assert reply["result"]["structured"]["received"] == {"deviceName": device, "action": "on"}
        assert {(n["from"], n["to"], n["rule"]) for n in reply["normalized"]} == {
            ("device_name", "deviceName", "static_map"),
            ("command", "action", "static_map"),
        }
        after = await device_state(caller, demo_worker, device)
        assert after["state"] == "on"
        if v5:
            assert correlation_of(message) is not None
            assert reply["id_generated"] is True
        else:
            assert reply["id_generated"] is False  # the body's id came back


async def test_v5_correlation_data_and_body_id_echoed(caller: Caller, demo_worker: Worker) -> None:
    topic = reply_topic_for(demo_worker.topics)
    await caller.subscribe(topic)
    await caller.publish(
        call_topic(demo_worker.topics, "echo"),
        json.dumps({"id": "abc-1", "arguments": {"text": "hi"}}),
        response_topic=topic,
        correlation=b"\x00\xffbinary",
    )
    message = await caller.next_message()
    reply = json.loads(message.payload)
    assert correlation_of(message) == b"\x00\xffbinary"
    assert reply["id"] == "abc-1" and reply["id_generated"] is False
    assert getattr(message.properties, "ContentType", None) == "application/json"


async def test_snake_to_camel_heuristic_for_mcp_tools(caller: Caller, demo_worker: Worker) -> None:
    reply = await caller.call_tool(
        demo_worker.topics, "get_device_sensor_data", {"device_name": "Hallway Sensor"}
    )
    assert reply["ok"], reply
    assert reply["normalized"] == [
        {
            "path": "arguments.device_name",
            "from": "device_name",
            "to": "deviceName",
            "rule": "snake_to_camel",
        }
    ]


async def test_mcp_server_rejection_reaches_caller_unchanged(
    caller: Caller, demo_worker: Worker
) -> None:
    reply = await caller.call_tool(
        demo_worker.topics, "control_zwave_device", {"device_name": "Garage Door", "command": "on"}
    )
    assert reply["ok"] is False
    assert reply["error"]["code"] == "tool_error"
    assert reply["error"]["details"]["server"] == "devices"
    # The server's own words, not ours:
    assert "Unknown device 'Garage Door'" in reply["error"]["message"]
    assert len(reply["normalized"]) == 2


async def test_tools_listing_over_mqtt(caller: Caller, demo_worker: Worker) -> None:
    tools = {t["name"]: t for t in await caller.list_tools(demo_worker.topics)}
    assert {
        "datetime",
        "echo",
        "control_zwave_device",
        "get_device_sensor_data",
        "list_devices",
    } <= set(tools)
    assert tools["control_zwave_device"]["origin"] == "mcp:devices"
    assert "deviceName" in tools["control_zwave_device"]["inputSchema"]["properties"]
    assert tools["echo"]["origin"] == "local"


async def test_invalid_arguments_listed_with_paths(caller: Caller, demo_worker: Worker) -> None:
    reply = await caller.call_tool(
        demo_worker.topics,
        "control_zwave_device",
        {"deviceName": "Switch One", "action": "explode", "level": "high"},
    )
    assert reply["error"]["code"] == "invalid_arguments"
    paths = {e["path"] for e in reply["error"]["details"]["errors"]}
    assert paths == {"action", "level"}
    assert {p["name"] for p in reply["error"]["details"]["signature"]} == {
        "deviceName",
        "action",
        "level",
    }
    # What a model needs for its next call, as the MCP server's schema says it.
    assert reply["error"]["details"]["parameters"] == [
        {
            "name": "deviceName",
            "type": "string",
            "required": True,
            "description": "Name of the device, e.g. 'Switch One'",
        },
        {
            "name": "action",
            "type": "string",
            "required": True,
            "enum": ["on", "off", "dim"],
            "description": "What to do",
        },
        {
            "name": "level",
            "type": "integer|null",
            "required": False,
            "description": "Brightness for dim",
        },
    ]


@pytest.fixture
def probe() -> Probe:
    return Probe()


async def open_gate_when_draining(worker: Worker, probe: Probe) -> None:
    async with asyncio.timeout(10):
        await worker.draining.wait()
    probe.release.set()


async def test_200_concurrent_requests_one_reply_each_within_bound(
    broker: Broker, probe: Probe
) -> None:
    bound = 8
    settings = make_settings(broker, concurrency=bound)
    async with running_worker(settings, probe_tools(probe)) as worker:
        callers = [Caller(broker.url, v5=i % 2 == 0) for i in range(4)]
        for c in callers:
            await c.__aenter__()
        try:
            results = await asyncio.gather(
                *(
                    c.call_tool(
                        worker.topics,
                        "busy",
                        {"n": i * 100 + n},
                        reply_topic=reply_topic_for(worker.topics, f"c{i}"),
                    )
                    for i, c in enumerate(callers)
                    for n in range(50)
                )
            )
            numbers = sorted(reply["result"]["structured"]["n"] for reply in results)
            assert numbers == sorted(i * 100 + n for i in range(4) for n in range(50))
            # A sentinel per caller: any duplicate reply would arrive before it.
            for i, c in enumerate(callers):
                await c.call_tool(
                    worker.topics,
                    "echo",
                    {"text": "end"},
                    reply_topic=reply_topic_for(worker.topics, f"c{i}"),
                )
            for c in callers:
                stray = [m for m in c.unclaimed() if json.loads(m.payload).get("tool") == "busy"]
                assert stray == [], "a request was answered twice"
        finally:
            for c in callers:
                await c.__aexit__(None, None, None)
        assert probe.calls == 200
        assert 1 < probe.max_active <= bound
        assert worker.in_flight.max_count <= bound


async def test_malformed_requests_over_the_wire(
    broker: Broker, caller: Caller, caller311: Caller, demo_worker: Worker
) -> None:
    """One of each path through a real broker: a v5 error reply, a 3.1.1 dead letter;
    every kind of bad input is in test_pipeline.py."""
    async with Caller(broker.url) as watcher:
        await watcher.subscribe(demo_worker.topics.dead)
        topic = reply_topic_for(demo_worker.topics)
        reply, _ = await caller.call(
            call_topic(demo_worker.topics), b"{not json", reply_topic=topic
        )
        assert reply["error"]["code"] == "bad_request"

        # Without a reply address (3.1.1, body unreadable): dead-lettered, payload kept.
        await caller311.publish(call_topic(demo_worker.topics), b"not json at all")
        letter = json.loads((await watcher.next_message()).payload)
        assert letter["error"]["code"] == "bad_request"
        assert letter["payload"] == "not json at all"

        # A valid request right after still succeeds.
        reply = await caller.call_tool(demo_worker.topics, "echo", {"text": "still here"})
        assert reply["ok"] and reply["result"]["structured"]["text"] == "still here"


async def test_reply_topic_outside_prefix_gets_nothing(
    broker: Broker, caller: Caller, probe: Probe
) -> None:
    async with (
        running_worker(make_settings(broker), probe_tools(probe)) as worker,
        Caller(broker.url) as watcher,
    ):
        await watcher.subscribe(worker.topics.dead)
        victim = f"{worker.topics.prefix}-victim/lights/set"
        await caller.subscribe(victim)
        await caller.publish(
            call_topic(worker.topics, "busy"),
            json.dumps({"arguments": {"n": 1}}),
            response_topic=victim,
        )
        letter = json.loads((await watcher.next_message()).payload)
        assert letter["error"]["code"] == "forbidden"
        # A sentinel on the caller's own reply topic: anything sent to the victim is before it.
        assert (await caller.call_tool(worker.topics, "echo", {"text": "end"}))["ok"]
        assert probe.calls == 0
        assert caller.unclaimed() == []


async def test_in_flight_calls_finish_on_stop(broker: Broker, caller: Caller, probe: Probe) -> None:
    """Stopping waits for in-flight calls (within the grace period) and replies to them."""
    settings = make_settings(broker, shutdown_grace_s=10.0)
    async with running_worker(settings, probe_tools(probe)) as worker:
        topic = reply_topic_for(worker.topics)
        await caller.subscribe(topic)
        for n in range(3):
            await caller.publish(
                call_topic(worker.topics, "gate"),
                json.dumps({"id": f"g{n}"}),
                response_topic=topic,
            )
        await probe.wait_active(3)
        # Stopping begins when the context exits; the gate opens once draining has begun.
        opener = asyncio.create_task(open_gate_when_draining(worker, probe), name="open-gate")
    await opener
    replies = [json.loads((await caller.next_message()).payload) for _ in range(3)]
    assert sorted(r["id"] for r in replies) == ["g0", "g1", "g2"]
    assert all(r["ok"] and r["result"]["text"] == "released" for r in replies)


async def test_calls_past_grace_get_unavailable(
    broker: Broker, caller: Caller, probe: Probe
) -> None:
    settings = make_settings(broker, shutdown_grace_s=0.2)
    async with running_worker(settings, probe_tools(probe)) as worker:
        topic = reply_topic_for(worker.topics)
        await caller.subscribe(topic)
        await caller.publish(
            call_topic(worker.topics, "gate"), json.dumps({"id": "late"}), response_topic=topic
        )
        await probe.wait_active(1)
    reply = json.loads((await caller.next_message()).payload)
    assert reply["id"] == "late" and reply["error"]["code"] == "unavailable"


async def test_mcp_server_that_cannot_start_leaves_the_rest_serving(
    broker: Broker, caller: Caller
) -> None:
    settings = make_settings(
        broker,
        mcpServers={
            "broken": {"command": "toolbus-no-such-binary-xyz"},
            "dies": {"command": "python3", "args": ["-c", "import sys; sys.exit(3)"]},
            "devices": DEMO_SERVER,
        },
    )
    async with running_worker(settings) as worker:
        assert worker.mcp.states() == {"broken": "down", "dies": "down", "devices": "ready"}
        assert (await caller.call_tool(worker.topics, "list_devices", {}))["ok"]
        assert (await caller.call_tool(worker.topics, "echo", {"text": "x"}))["ok"]


async def test_random_garbage_is_answered_and_the_worker_lives(
    caller: Caller, demo_worker: Worker
) -> None:
    rng = random.Random(2026)
    topic = reply_topic_for(demo_worker.topics)
    payloads = [rng.randbytes(rng.randint(0, 2000)) for _ in range(100)]
    payloads += [
        b'{"tool": "echo", "arguments": {"text": ' + bytes([rng.randint(0, 255)]) + b"}}"
        for _ in range(20)
    ]
    replies = await asyncio.gather(
        *(
            caller.call(call_topic(demo_worker.topics, "echo"), p, reply_topic=topic)
            for p in payloads
        )
    )
    for payload, (reply, _) in zip(payloads, replies, strict=True):
        if re.fullmatch(rb'\{"tool": "echo", "arguments": \{"text": \d\}\}', payload):
            assert reply["ok"]  # a digit is a number for a string parameter: its text
        else:
            assert reply["error"]["code"] in {"bad_request", "invalid_arguments"}
    reply = await caller.call_tool(demo_worker.topics, "echo", {"text": "alive"}, reply_topic=topic)
    assert reply["ok"]


async def test_a_tool_that_exits_costs_only_its_call(broker: Broker, caller: Caller) -> None:
    """`sys.exit()` or KeyboardInterrupt in a local tool: `tool_error`, and the worker goes on."""
    async with running_worker(make_settings(broker), [quits]) as worker:
        for how, exception in [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")]:
            reply = await caller.call_tool(worker.topics, "quits", {"how": how})
            assert reply["error"]["code"] == "tool_error"
            assert reply["error"]["details"]["exception"] == exception
        assert (await caller.call_tool(worker.topics, "echo", {"text": "still here"}))["ok"]


async def test_the_message_expiry_travels_to_the_call_and_its_reply(
    broker: Broker, caller: Caller, probe: Probe
) -> None:
    """Over the wire: the broker hands the worker the remaining Message Expiry Interval,
    which caps the call's deadline and becomes the reply's own expiry."""
    async with running_worker(make_settings(broker), probe_tools(probe)) as worker:
        topic = reply_topic_for(worker.topics)
        await caller.subscribe(topic)
        await caller.publish(
            call_topic(worker.topics, "echo"),
            json.dumps({"id": "e-1", "arguments": {"text": "x"}}),
            response_topic=topic,
            expiry_s=30,
        )
        echoed = await caller.next_message()
        assert json.loads(echoed.payload)["ok"] is True
        assert 28 <= getattr(echoed.properties, "MessageExpiryInterval", 0) <= 30
        # Asked for 20 s, but the message itself expires in 1 s: cancelled at about 1 s.
        await caller.publish(
            call_topic(worker.topics, "sleepy"),
            json.dumps({"id": "e-2", "timeout_s": 20}),
            response_topic=topic,
            expiry_s=1,
        )
        capped = json.loads((await caller.next_message(timeout_s=5)).payload)
    assert capped["id"] == "e-2" and capped["error"]["code"] == "timeout"
    assert capped["error"]["details"]["timeout_s"] <= 1
    assert probe.cancelled == 1


async def test_a_311_caller_past_its_deadline_ms_gets_expired(broker: Broker, probe: Probe) -> None:
    async with (
        running_worker(make_settings(broker), probe_tools(probe)) as worker,
        Caller(broker.url, v5=False) as old,
    ):
        past = int(time.time() * 1000) - 10
        reply = await old.call_tool(worker.topics, "busy", {"n": 1}, deadline_ms=past)
    assert reply["error"]["code"] == "timeout" and reply["error"]["details"]["expired"] is True
    assert probe.calls == 0


async def test_the_broker_holds_what_the_worker_cannot_take(
    broker: Broker, caller: Caller, probe: Probe
) -> None:
    """Receive Maximum = concurrency: with one slot busy the other requests wait in the
    broker, not in the worker's memory, and each is answered once the slot frees."""
    settings = make_settings(broker, concurrency=1)
    async with running_worker(settings, probe_tools(probe)) as worker:
        topic = reply_topic_for(worker.topics)
        await caller.subscribe(topic)
        for n in range(5):
            await caller.publish(
                call_topic(worker.topics, "gate"), json.dumps({"id": f"q{n}"}), response_topic=topic
            )
        await probe.wait_active(1)
        # A round trip of the caller's own through the broker: every request above has
        # been routed by the time it returns, so any over-delivery would be here by now.
        sentinel = reply_topic_for(worker.topics, "sentinel")
        await caller.subscribe(sentinel)
        await caller.publish(sentinel, b"after")
        assert (await caller.next_message()).topic.value == sentinel
        assert worker.queued() == 0
        probe.release.set()
        replies = [json.loads((await caller.next_message()).payload) for _ in range(5)]
    assert sorted(r["id"] for r in replies) == [f"q{n}" for n in range(5)]
    assert all(r["ok"] for r in replies)
    assert probe.max_active == 1


async def test_worker_reconnects_after_the_broker_restarts(tmp_path: Path) -> None:
    own = Broker(tmp_path)  # a broker of this test's own: it gets killed
    own.start()
    try:
        settings = make_settings(own, reconnect_max_delay_s=1.0)
        async with running_worker(settings) as worker:
            status_topic = f"{worker.topics.prefix}/status/workers/+"
            async with Caller(own.url) as caller:
                assert (await caller.call_tool(worker.topics, "echo", {"text": "1"}))["ok"]
            own.stop()
            own.start()  # same port, empty broker: no sessions, no retained messages
            async with Caller(own.url) as caller:
                await caller.subscribe(status_topic)
                async with asyncio.timeout(30):
                    while json.loads((await caller.messages.get()).payload)["state"] != "online":
                        pass
                await worker.subscribed.wait()
                reply = await caller.call_tool(worker.topics, "echo", {"text": "2"})
                assert reply["ok"] and reply["result"]["structured"]["text"] == "2"
    finally:
        own.stop()


async def test_a_cancelled_start_leaves_nothing_running() -> None:
    """A caller that gives up on `async with worker` (its own timeout) must not leave the
    worker reconnecting in the background."""
    nobody = f"mqtt://127.0.0.1:{free_port()}"  # refused: the worker keeps retrying
    settings = Settings.model_validate({"broker_url": nobody, "worker_id": "cancelled-start"})
    worker = build_worker(settings, [])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(worker.__aenter__(), timeout=0.3)
    assert [t for t in asyncio.all_tasks() if t.get_name() == "worker:cancelled-start"] == []


async def test_a_stop_while_the_broker_is_down_gives_late_replies_up_at_once(
    tmp_path: Path, probe: Probe
) -> None:
    """Stopped while its broker is gone: a call that ends within the grace period has no
    connection to reply on, and none will come (the worker stops, it does not
    reconnect). Its reply is lost at once, with a warning, not after `publish_timeout_s`
    of waiting for a reconnect; nothing is logged as an error."""
    own = Broker(tmp_path)  # a broker of this test's own: it gets killed
    own.start()
    try:
        settings = make_settings(own, shutdown_grace_s=10.0, publish_timeout_s=30.0)
        with watching("toolbus", level=logging.WARNING) as logged:
            async with running_worker(settings, probe_tools(probe)) as worker:
                async with Caller(own.url) as caller:
                    await caller.publish(
                        call_topic(worker.topics, "gate"),
                        json.dumps({"id": "late"}),
                        response_topic=reply_topic_for(worker.topics),
                    )
                    await probe.wait_active(1)
                with watching("toolbus.service", "connection lost") as lost:
                    own.kill()
                    async with asyncio.timeout(10):
                        await lost.seen.wait()
                opener = asyncio.create_task(open_gate_when_draining(worker, probe))
                started = time.monotonic()
                async with asyncio.timeout(STOPPED_AT_ONCE_S):
                    await worker.__aexit__(None, None, None)
            await opener
        measured(f"stop with the broker gone, a call in flight: {time.monotonic() - started:.2f} s")
        assert probe.active == 0  # the call ran to its end
        lost_replies = [r for r in logged.records if r.name == "toolbus.publisher"]
        assert [r.levelno for r in lost_replies] == [logging.WARNING]
        assert [r for r in logged.records if r.levelno >= logging.ERROR] == []
    finally:
        own.kill()


async def test_a_retained_request_runs_at_no_resubscribe(broker: Broker, probe: Probe) -> None:
    """A request published with the retain flag ran again at every worker (re)start: the
    broker hands a filter's retained messages to each new subscription (3 runs over 2
    restarts). The call topics are subscribed with Retain Handling 2 (issue 24)."""
    settings = make_settings(broker, concurrency=1)  # one at a time: in delivery order
    retained_body = json.dumps({"tool": "busy", "arguments": {"n": 7}})
    async with Caller(broker.url) as caller:
        for start in range(3):
            async with running_worker(settings, probe_tools(probe)) as worker:
                topic = call_topic(worker.topics)
                if start == 0:  # live, once: this delivery runs, as any request does
                    await caller.client.publish(topic, retained_body, qos=1, retain=True)
                # Answered after anything the subscription was handed before it.
                sentinel = await caller.call_tool(worker.topics, "echo", {"text": "end"})
                assert sentinel["ok"], sentinel
        await caller.client.publish(topic, b"", qos=1, retain=True)  # clear it
    assert probe.calls == 1
