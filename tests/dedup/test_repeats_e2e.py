"""What a repeat is, through a real mosquitto (issue 23): the reports' own examples.

The README's `req-1` sent with `command=off`, then `command=on`; two anonymous clients
on one id; an OpenAI-compatible server's `call_0` on every turn, run by
`Client.run_tool_calls`; a caller name forged in claim mode; and the Python client's
retries, which stay repeats (the same id, the same body) beside another client's
request under the same id. Each pipeline case is in test_repeats.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.support.harness import DEMO_SERVER, Broker, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.providers import chat_completion_model
from tests.support.tools import Probe, probe_tools
from toolbus import Client, Retry
from toolbus.wire.errors import BadRequest
from toolbus.worker.service import Worker

README_REQUEST = {
    "id": "req-1",
    "tool": "control_zwave_device",
    "arguments": {"device_name": "Switch One", "command": "on"},
    "timeout_s": 10,
}


@pytest_asyncio.fixture(scope="module")
async def devices(broker: Broker) -> AsyncIterator[Worker]:
    """A worker of this module's own with the demo device server: the tests here switch
    devices, which no other test must see."""
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER})
    async with running_worker(settings) as worker:
        yield worker


def readme_request(command: str, **changes: Any) -> dict[str, Any]:
    arguments = {**README_REQUEST["arguments"], "command": command}  # type: ignore[dict-item]
    return {**README_REQUEST, "arguments": arguments, **changes}


async def state_of(caller: Caller, worker: Worker, device: str) -> str:
    reply = await caller.call_tool(worker.topics, "get_device_sensor_data", {"device_name": device})
    return str(reply["result"]["structured"]["state"])


async def test_the_readme_request_sent_off_then_on_is_not_answered_with_off(
    devices: Worker, caller: Caller
) -> None:
    """The README's own example, from one client (one reply topic): `on` under the id
    that said `off` is refused, `id_reused`, not `ok` with the first's result; the same
    `off` in the schema's own spelling is the repeat it is."""
    topics, mine = devices.topics, reply_topic_for(devices.topics)
    off = await caller.call_tool(topics, **readme_request("off"), reply_topic=mine)
    assert off["ok"] and off["result"]["structured"]["received"]["action"] == "off"
    on = await caller.call_tool(topics, **readme_request("on"), reply_topic=mine)
    assert (on["ok"], on["replayed"], on["error"]["code"]) == (False, False, "bad_request")
    assert on["error"]["details"]["reason"] == "id_reused" and on.get("result") is None
    assert await state_of(caller, devices, "Switch One") == "off"  # and the caller knows it
    respelled = readme_request(
        "off", tool="ControlZwaveDevice", arguments={"deviceName": "Switch One", "action": "off"}
    )
    again = await caller.call_tool(topics, **respelled, reply_topic=mine)
    assert again["replayed"] is True and again["result"] == off["result"]
    fresh = await caller.call_tool(topics, **readme_request("on", id="req-2"), reply_topic=mine)
    assert fresh["ok"] and await state_of(caller, devices, "Switch One") == "on"


async def test_two_anonymous_clients_never_read_each_other_s_results(
    devices: Worker, broker: Broker
) -> None:
    async with Caller(broker.url) as c, Caller(broker.url) as d:
        topics = devices.topics
        secret = await c.call_tool(topics, "echo", {"text": "c-secret"}, id="anon-1")
        mine = await d.call_tool(topics, "echo", {"text": "d-text"}, id="anon-1")
    assert secret["result"]["structured"]["text"] == "c-secret"
    assert mine["ok"] and mine["replayed"] is False
    assert mine["result"]["structured"]["text"] == "d-text"


async def test_an_agent_loop_on_a_server_numbering_its_calls_call_0(
    devices: Worker, broker: Broker
) -> None:
    """Turn 2's `call_0` asks `datetime`: it runs, and the model reads a time, not turn
    1's echo."""
    async with Client(broker.url, prefix=devices.topics.prefix) as client:
        turn_1 = await client.run_tool_calls(
            chat_completion_model(("call_0", "echo", '{"text": "turn one"}'))
        )
        turn_2 = await client.run_tool_calls_reply(
            chat_completion_model(("call_0", "datetime", "{}"))
        )
    assert [m["tool_call_id"] for m in turn_1] == ["call_0"]
    assert json.loads(turn_1[0]["content"])["text"] == "turn one"
    [message] = turn_2.append
    assert message["tool_call_id"] == "call_0"
    assert set(json.loads(str(message["content"]))) >= {"iso", "timezone", "weekday"}
    assert [r.replayed for r in turn_2.results] == [False]


async def test_a_forged_caller_cannot_answer_that_caller_s_call(
    devices: Worker, broker: Broker, caller: Caller
) -> None:
    """Claim mode (the default): anyone may say `kitchen`. An `echo` planted under
    kitchen's next id is not replayed to kitchen's real call: kitchen hears `id_reused`
    (its call refused, not answered with the planted result)."""
    ident = f"order-{uuid.uuid4().hex[:6]}"
    planted = await caller.call_tool(
        devices.topics, "echo", {"text": "planted"}, caller="kitchen", id=ident
    )
    assert planted["ok"]
    async with Client(broker.url, prefix=devices.topics.prefix, caller="kitchen") as kitchen:
        with pytest.raises(BadRequest) as refused:
            await kitchen.call(
                "control_zwave_device", {"deviceName": "Switch Two", "action": "on"}, id=ident
            )
    assert refused.value.details == {"reason": "id_reused"}
    assert refused.value.reply is not None and refused.value.reply.result is None
    assert await state_of(caller, devices, "Switch Two") == "off"


async def test_a_client_s_retries_stay_repeats_beside_another_client_s_same_id(
    broker: Broker,
) -> None:
    """Client A's call runs; A sends it again (no answer yet): the same id, the same body,
    so it waits for that run. Client B, on another reply topic, uses the same id for its
    own call: it runs and gets its own result, never A's."""
    probe = Probe()
    settings = make_settings(broker)
    retry = Retry(attempts=5, interval_s=0.2)
    async with (
        running_worker(settings, probe_tools(probe)),
        Client(broker.url, prefix=settings.topic_prefix, retry=retry) as a,
        Client(broker.url, prefix=settings.topic_prefix) as b,
        Caller(broker.url) as observer,
    ):
        await observer.subscribe(a.reply_topic)  # every answer A gets
        with watching("toolbus.client", "sending it again") as resent:
            held = asyncio.create_task(a.call("gate", id="same", timeout_s=10), name="a")
            await probe.wait_active(1)
            async with asyncio.timeout(10):
                await resent.seen.wait()
        other = await b.call("busy", {"n": 2, "hold_ms": 1}, id="same", timeout_s=10)
        assert other.result is not None and other.result.structured == {"n": 2}
        assert other.replayed is False
        probe.release.set()
        first = await asyncio.wait_for(held, 10)
        answers = [json.loads((await observer.next_message()).payload) for _ in range(2)]
    assert first.result is not None and first.result.text == "released"
    assert sorted(answer["replayed"] for answer in answers) == [False, True]
    assert probe.calls == 2  # gate once (its repeat waited for it), busy once
