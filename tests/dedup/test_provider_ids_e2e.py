"""A stale answer for a new question (issue 30.1), through a real mosquitto.

The report's case: an MQTT 3.1.1 caller (or a v5 one without Correlation Data) forwards
an OpenAI-compatible message whose call is `call_0` every turn. Turn 2 reads the sensor
again, exactly as turn 1 did, after the device changed: it must read the new value, not
get turn 1's stored reply. Both sides: a copy of the message while its run goes is a
transport retry and runs nothing; with Correlation Data or `toolbus.id` repeats still
replay. The broker's own redelivery (DUP) after a worker restart: test_provider_ids_dup.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from tests.support.providers import chat_completion
from tests.support.tools import Probe, probe_tools
from toolbus.backends.local.functions import LocalTool, tool
from toolbus.worker.service import Worker

WAIT_S = 15.0


@dataclass
class Device:
    """What the sensor reads, and how often each tool ran."""

    state: str = "off"
    runs: int = 0


def sensor_tools(device: Device) -> list[LocalTool]:
    @tool
    async def read_sensor(device_name: str) -> dict[str, str]:
        """The device's state now (configured idempotent: safe to run twice)."""
        device.runs += 1
        return {"device": device_name, "state": device.state}

    @tool
    async def poll_sensor(device_name: str) -> dict[str, str]:
        """The device's state now (an ordinary tool: nothing says it is safe to repeat)."""
        device.runs += 1
        return {"device": device_name, "state": device.state}

    return [read_sensor, poll_sensor]


@dataclass
class Rig:
    worker: Worker
    device: Device
    probe: Probe


@pytest_asyncio.fixture(scope="module")
async def rig(broker: Broker) -> AsyncIterator[Rig]:
    device, probe = Device(), Probe()
    settings = make_settings(broker, tools={"read_sensor": {"idempotent": True}})
    async with running_worker(settings, [*sensor_tools(device), *probe_tools(probe)]) as worker:
        yield Rig(worker, device, probe)


@pytest_asyncio.fixture(params=["3.1.1", "v5-no-correlation"])
async def sender(request: pytest.FixtureRequest, broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url, v5=request.param != "3.1.1") as caller:
        yield caller


def turn(tool: str, arguments: dict[str, Any], **options: Any) -> dict[str, Any]:
    """The model's message: one call, `call_0`, answered as a plain Reply."""
    body = chat_completion(("call_0", tool, json.dumps(arguments)))
    return body | {"toolbus": {"reply_format": "toolbus", **options}}


async def publish(
    caller: Caller, rig: Rig, body: dict[str, Any], reply_topic: str, **publish: Any
) -> None:
    """Publishes `body` once, as the caller's protocol does (3.1.1: `reply_to` in the
    body; v5: a Response Topic, Correlation Data only if given)."""
    await caller.subscribe(reply_topic)
    if caller.v5:
        payload = json.dumps(body).encode()
        await caller.publish(
            call_topic(rig.worker.topics), payload, response_topic=reply_topic, **publish
        )
    else:
        options = {**body["toolbus"], "reply_to": reply_topic}
        payload = json.dumps(body | {"toolbus": options}).encode()
        await caller.publish(call_topic(rig.worker.topics), payload)


async def reply_on(caller: Caller, reply_topic: str) -> dict[str, Any]:
    message = await caller.next_message(WAIT_S)
    assert message.topic.value == reply_topic
    assert isinstance(message.payload, bytes)
    return dict(json.loads(message.payload))


async def ask(
    caller: Caller, rig: Rig, body: dict[str, Any], reply_topic: str, **options: Any
) -> dict[str, Any]:
    """`body` published once; its reply."""
    await publish(caller, rig, body, reply_topic, **options)
    return await reply_on(caller, reply_topic)


@pytest.mark.parametrize("tool_name", ["read_sensor", "poll_sensor"])
async def test_turn_2_asking_what_turn_1_asked_reads_the_device_anew(
    rig: Rig, sender: Caller, tool_name: str
) -> None:
    """Turn 1 reads `off`; the device is switched on; turn 2 asks the same (`call_0`,
    the same tool and arguments) and reads `on`: it ran, nothing replayed. Before
    issue 30 it got turn 1's stored `off`, `replayed: true`."""
    mine, name = reply_topic_for(rig.worker.topics), f"lamp-{uuid.uuid4().hex[:6]}"
    rig.device.state, runs = "off", rig.device.runs
    first = await ask(sender, rig, turn(tool_name, {"device_name": name}), mine)
    rig.device.state = "on"
    second = await ask(sender, rig, turn(tool_name, {"device_name": name}), mine)
    assert first["result"]["structured"]["state"] == "off"
    assert (second["id"], second["replayed"]) == ("call_0", False)
    assert second["result"]["structured"]["state"] == "on"
    assert rig.device.runs == runs + 2


async def test_a_copy_while_the_call_runs_runs_nothing(rig: Rig, sender: Caller) -> None:
    """The same message sent again before its answer (a transport retry) joins the run:
    given a short deadline of its own, it says the call still runs; the tool ran once."""
    mine = reply_topic_for(rig.worker.topics)
    calls = rig.probe.calls
    rig.probe.release.clear()
    await publish(sender, rig, turn("gate", {}), mine)
    await rig.probe.wait_active(1)
    copy = await ask(sender, rig, turn("gate", {}, timeout_s=0.5), mine)  # the gate is shut
    assert copy["error"]["code"] == "timeout" and copy["error"]["details"]["still_running"]
    rig.probe.release.set()
    reply = await reply_on(sender, mine)
    assert reply["ok"] and reply["replayed"] is False
    assert rig.probe.calls == calls + 1


async def test_with_correlation_data_a_repeat_still_replays(rig: Rig, broker: Broker) -> None:
    """A v5 caller's Correlation Data is ours: the same message with it again (a retry)
    gets the stored reply, even after the device changed; new Correlation Data runs."""
    mine, name = reply_topic_for(rig.worker.topics), f"lamp-{uuid.uuid4().hex[:6]}"
    body = turn("poll_sensor", {"device_name": name})
    rig.device.state, runs = "off", rig.device.runs
    async with Caller(broker.url) as caller:
        first = await ask(caller, rig, body, mine, correlation=b"turn-1")
        rig.device.state = "on"
        again = await ask(caller, rig, body, mine, correlation=b"turn-1")
        fresh = await ask(caller, rig, body, mine, correlation=b"turn-2")
    assert again["replayed"] is True and again["result"] == first["result"]
    assert fresh["replayed"] is False and fresh["result"]["structured"]["state"] == "on"
    assert rig.device.runs == runs + 2


async def test_with_toolbus_id_a_repeat_still_replays(rig: Rig, sender: Caller) -> None:
    """`toolbus.id` is ours, from either protocol: the same message under it again gets
    the stored reply; the next turn under a new `toolbus.id` runs."""
    mine, name = reply_topic_for(rig.worker.topics), f"lamp-{uuid.uuid4().hex[:6]}"
    rig.device.state, runs = "off", rig.device.runs
    first = await ask(sender, rig, turn("poll_sensor", {"device_name": name}, id="t-1"), mine)
    rig.device.state = "on"
    again = await ask(sender, rig, turn("poll_sensor", {"device_name": name}, id="t-1"), mine)
    fresh = await ask(sender, rig, turn("poll_sensor", {"device_name": name}, id="t-2"), mine)
    assert again["replayed"] is True and again["result"] == first["result"]
    assert fresh["replayed"] is False and fresh["result"]["structured"]["state"] == "on"
    assert rig.device.runs == runs + 2
