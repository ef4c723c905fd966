"""A provider's tool-call id alone is no idempotency key (issue 30.1), in-process.

An OpenAI-compatible server numbers each response's calls `call_0`, ...; a caller with
no id of ours beside it (MQTT 3.1.1, or v5 without Correlation Data, and no
`toolbus.id`) asking what it asked last turn must get a fresh run, never last turn's
stored answer. A copy of the message while its run still goes is a transport retry and
waits for that run; a copy the broker marks as delivered again (DUP) after the run ended
gets its reply, except from a tool safe to repeat, which runs. With correlation data or
`toolbus.id`, repeats replay as before. Through a real broker: test_provider_ids_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.calls.test_pipeline import REPLY, Rig, standard_rig
from tests.support.harness import RedisServer
from tests.support.providers import chat_completion
from toolbus.dedup import open_store

OWN_REPLY = {"reply_format": "toolbus"}  # one call answered as a plain Reply


@pytest_asyncio.fixture(params=["memory", "redis"])
async def rig(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Rig]:
    url = "memory" if request.param == "memory" else redis_server.url
    built = standard_rig(store=open_store(url, "w1", prefix=f"t{uuid.uuid4().hex[:8]}"))
    async with built.pipeline:
        yield built


def message(tool: str, arguments: dict[str, Any], **options: Any) -> dict[str, Any]:
    """An OpenAI message whose one call is `call_0`, answered as a plain Reply."""
    return chat_completion(("call_0", tool, json.dumps(arguments))) | {
        "toolbus": {**OWN_REPLY, **options}
    }


async def sent(rig: Rig, body: dict[str, Any], **inbound: Any) -> dict[str, Any]:
    """Sent without correlation data (a v5 caller that sets none), `inbound` as received."""
    await rig.request(None, body, correlation=None, **inbound)
    return rig.reply()


async def sent_311(rig: Rig, body: dict[str, Any], **inbound: Any) -> dict[str, Any]:
    """Sent as a 3.1.1 caller does: no properties, `reply_to` in the body."""
    options = {**body["toolbus"], "reply_to": REPLY}
    await rig.request(None, body | {"toolbus": options}, response_topic=None, **inbound)
    return rig.reply()


SENDERS = [sent, sent_311]


@pytest.mark.parametrize("send", SENDERS, ids=["v5-no-correlation", "3.1.1"])
@pytest.mark.parametrize("tool", ["busy", "echo"], ids=["ordinary", "idempotent"])
async def test_the_same_call_0_next_turn_runs_again(rig: Rig, send: Any, tool: str) -> None:
    """Turn 2 asks exactly what turn 1 did, under the same `call_0`: it runs, whatever
    the tool (busy: ordinary; echo: idempotent in this rig), and is not replayed."""
    arguments = {"n": 1} if tool == "busy" else {"text": "x"}
    turn_1 = await send(rig, message(tool, arguments))
    turn_2 = await send(rig, message(tool, arguments))
    assert turn_1["ok"] and turn_2["ok"]
    assert (turn_1["replayed"], turn_2["replayed"]) == (False, False)
    assert rig.probe.calls == (2 if tool == "busy" else 0)


@pytest.mark.parametrize("send", SENDERS, ids=["v5-no-correlation", "3.1.1"])
async def test_a_copy_sent_while_the_call_runs_waits_for_it(rig: Rig, send: Any) -> None:
    """A transport retry (the same message again before its answer) joins the run: with
    a short deadline of its own it says the call is still running (it neither ran nor
    replayed anything), and the tool runs once."""
    first = asyncio.create_task(send(rig, message("gate", {})), name="first")
    await rig.probe.wait_active(1)
    copy = await send(rig, message("gate", {}, timeout_s=0.3))
    assert copy["error"]["code"] == "timeout" and copy["error"]["details"]["still_running"]
    rig.probe.release.set()
    async with asyncio.timeout(10):
        reply = await first
    assert reply["ok"] and reply["replayed"] is False and rig.probe.calls == 1


@pytest.mark.parametrize("send", SENDERS, ids=["v5-no-correlation", "3.1.1"])
async def test_a_broker_redelivery_after_the_run_gets_its_reply(rig: Rig, send: Any) -> None:
    """DUP set: the broker delivered this very message before (a worker restarted
    before acknowledging it). It is no new question: replayed, nothing run again."""
    body = message("busy", {"n": 3})
    first = await send(rig, body, packet_id=5, delivery_id="session:5")
    again = await send(rig, body, packet_id=5, delivery_id="session:5", redelivered=True)
    assert again["replayed"] is True and again["result"] == first["result"]
    assert rig.probe.calls == 1


async def test_a_redelivery_of_a_tool_safe_to_repeat_runs_again(rig: Rig) -> None:
    """A tool safe to repeat never replays a provider-only call: it runs for fresh data."""
    body = message("echo", {"text": "fresh"})
    await sent(rig, body, packet_id=5, delivery_id="session:5")
    again = await sent(rig, body, packet_id=5, delivery_id="session:5", redelivered=True)
    assert again["ok"] and again["replayed"] is False


async def test_with_correlation_data_the_same_message_again_is_replayed(rig: Rig) -> None:
    """Our id beside the provider's: a retry (same correlation data) replays, and a new
    turn (new correlation data) runs."""
    body = message("busy", {"n": 4})
    await rig.request(None, body, correlation=b"turn-1")
    first = rig.reply()
    await rig.request(None, body, correlation=b"turn-1")
    assert rig.reply()["replayed"] is True
    await rig.request(None, body, correlation=b"turn-2")
    assert rig.reply()["replayed"] is False
    assert first["ok"] and rig.probe.calls == 2


@pytest.mark.parametrize("send", SENDERS, ids=["v5-no-correlation", "3.1.1"])
async def test_with_toolbus_id_the_same_message_again_is_replayed(rig: Rig, send: Any) -> None:
    """`toolbus.id` is ours: the same message again (a retry) replays, a new turn under a
    new `toolbus.id` runs. What a 3.1.1 caller sends for exactly once across turns."""
    turn_1 = message("busy", {"n": 5}, id="turn-1")
    await send(rig, turn_1)
    assert (await send(rig, turn_1))["replayed"] is True
    assert (await send(rig, message("busy", {"n": 5}, id="turn-2")))["replayed"] is False
    assert (await send(rig, message("busy", {"n": 5}, id="turn-2")))["replayed"] is True
    assert rig.probe.calls == 2


async def test_our_own_ids_keep_their_rules(rig: Rig) -> None:
    """The envelope's id, without correlation data or from 3.1.1: a repeat replays, a
    reuse is `id_reused`, as before."""
    body = {"id": "own-1", "tool": "busy", "arguments": {"n": 6}}
    await sent(rig, body)
    assert (await sent(rig, body))["replayed"] is True
    other = await sent(rig, {**body, "arguments": {"n": 7}})
    assert other["error"]["details"] == {"reason": "id_reused"}
    assert rig.probe.calls == 1


# What each message asks: a tool and its arguments (the busy tool counts its runs).
ASKS = [("busy", {"n": 1}), ("busy", {"n": 2}), ("echo", {"text": "x"})]

turns = st.lists(
    st.tuples(
        st.sampled_from(["call_0", "call_1"]),  # few ids, so that they collide
        st.sampled_from(range(len(ASKS))),
        st.sampled_from([None, None, b"c1", b"c2"]),  # correlation data: most send none
    ),
    min_size=1,
    max_size=10,
)


@pytest.mark.parametrize("kind", ["memory", "redis"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=turns)
async def test_only_an_id_of_ours_ever_replays(
    kind: str, redis_server: RedisServer, sequence: list[tuple[str, int, bytes | None]]
) -> None:
    """Random turns of one caller against the rule: a message replays only when it
    carries correlation data and its id's record asked what it asks with that same
    correlation data; every other message runs and gets its own result."""
    url = "memory" if kind == "memory" else redis_server.url
    rig = standard_rig(store=open_store(url, "w1", prefix=f"t{uuid.uuid4().hex[:8]}"))
    records: dict[str, tuple[int, bytes | None]] = {}
    runs = 0
    async with rig.pipeline:
        for ident, ask, correlation in sequence:
            tool, arguments = ASKS[ask]
            body = chat_completion((ident, tool, json.dumps(arguments)))
            await rig.request(None, body | {"toolbus": OWN_REPLY}, correlation=correlation)
            reply = rig.reply()
            asked = (ask, correlation)
            replays = correlation is not None and records.get(ident) == asked
            assert reply["ok"] and reply["replayed"] is replays, (reply, asked)
            assert reply["result"]["structured"] == (
                arguments if tool == "busy" else {"text": "x", "data": None}
            )
            records[ident] = asked
            runs += tool == "busy" and not replays
    assert rig.probe.calls == runs
