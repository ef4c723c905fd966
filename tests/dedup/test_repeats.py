"""What a repeat is: the same request id asking for the same thing (issue 23).

Deduplication keys on (caller, id), or (reply topic, id) for a caller that names none,
and keeps a fingerprint of what the call asked for: its tool's canonical name and its
arguments as normalized. A reused id asking for something else never gets the stored
reply. In-process (`Pipeline.handle` and a `ListPublisher`), against the memory store
and a real Redis; test_repeats_e2e.py shows the same through a real broker.
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

from tests.calls.test_pipeline import CORRELATION, REPLY, Rig, anonymous_key, rig_for, standard_rig
from tests.support.harness import RedisServer
from tests.support.providers import chat_completion
from tests.support.tools import Probe, probe_tools
from toolbus.dedup import DedupStore, fingerprint, open_store
from toolbus.dedup.redis import RedisStore

OWN_REPLY = {"reply_format": "toolbus"}  # a provider's one call answered as a plain Reply


def store_for(kind: str, redis_server: RedisServer, worker_id: str = "w1") -> DedupStore:
    """The store as production opens it (`open_store`): over Redis, replies the store
    fails to take kept by the worker (`KeptReplies`)."""
    url = "memory" if kind == "memory" else redis_server.url
    return open_store(url, worker_id, prefix=f"t{uuid.uuid4().hex[:8]}")


@pytest_asyncio.fixture(params=["memory", "redis"])
async def rig(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Rig]:
    built = standard_rig(store=store_for(request.param, redis_server))
    async with built.pipeline:
        yield built


async def send(rig: Rig, body: dict[str, Any], topic: str = REPLY, tool: str | None = None) -> Any:
    """One request answered on `topic`; its reply, parsed."""
    await rig.request(tool, body, response_topic=topic)
    return rig.reply(topic)


def assert_id_reused(reply: dict[str, Any]) -> None:
    assert reply["ok"] is False and reply["replayed"] is False
    assert reply["error"]["code"] == "bad_request"
    assert reply["error"]["details"] == {"reason": "id_reused"}
    assert reply.get("result") is None  # nothing of the other request's


# -- the caller's own ids ----------------------------------------------------------------


async def test_the_same_id_asking_for_other_arguments_is_refused_id_reused(rig: Rig) -> None:
    first = await send(rig, {"id": "req-1", "tool": "busy", "arguments": {"n": 1}})
    other = await send(rig, {"id": "req-1", "tool": "busy", "arguments": {"n": 2}})
    assert first["ok"] and first["result"]["structured"] == {"n": 1}
    assert_id_reused(other)
    assert rig.probe.calls == 1
    again = await send(rig, {"id": "req-1", "tool": "busy", "arguments": {"n": 1}})
    assert again["replayed"] is True and again["result"] == first["result"]  # still the record


async def test_another_tool_under_the_same_id_is_refused_id_reused(rig: Rig) -> None:
    assert (await send(rig, {"id": "r", "tool": "echo", "arguments": {"text": "x"}}))["ok"]
    assert_id_reused(await send(rig, {"id": "r", "tool": "busy", "arguments": {"n": 1}}))
    assert rig.probe.calls == 0


async def test_a_repeat_in_other_spellings_is_a_repeat(rig: Rig) -> None:
    """The fingerprint is of the canonical tool and the normalized arguments: `Echo`
    with the number 1234 asks what `echo` with the text "1234" asks."""
    first = await send(rig, {"id": "s1", "tool": "Echo", "arguments": {"text": 1234}})
    assert first["ok"] and first["replayed"] is False
    assert [c["rule"] for c in first["normalized"]] == ["tool_spelling", "number_to_string"]
    again = await send(rig, {"id": "s1", "arguments": {"text": "1234"}}, tool="echo")
    assert again["replayed"] is True and again["result"] == first["result"]
    assert_id_reused(await send(rig, {"id": "s1", "tool": "echo", "arguments": {"text": 12345}}))


async def test_an_explicit_id_beside_its_running_call_is_refused_without_waiting(
    rig: Rig,
) -> None:
    held = asyncio.create_task(rig.request("gate", {"id": "g1"}), name="held")
    await rig.probe.wait_active(1)
    async with asyncio.timeout(10):  # answered while the gate is still shut
        other = await send(rig, {"id": "g1", "tool": "busy", "arguments": {"n": 1}})
    assert_id_reused(other)
    rig.probe.release.set()
    async with asyncio.timeout(10):
        await held
    gate = rig.reply()
    assert gate["ok"] and gate["result"]["text"] == "released" and gate["replayed"] is False


async def test_a_forged_caller_cannot_plant_a_reply_for_that_caller_s_call(rig: Rig) -> None:
    """Claim mode: anyone may name `hall`. An `echo` planted under hall's next id is not
    what hall's real call asks for: hall hears `id_reused`, never the planted result."""
    planted = {"caller": "hall", "id": "order-43", "tool": "echo", "arguments": {"text": "evil"}}
    assert (await send(rig, planted, "tb/reply/attacker"))["ok"]
    real = {"caller": "hall", "id": "order-43", "tool": "busy", "arguments": {"n": 43}}
    reply = await send(rig, real, "tb/reply/hall")
    assert_id_reused(reply)
    assert rig.probe.calls == 0


async def test_a_named_caller_s_repeat_from_another_reply_topic_is_a_repeat(rig: Rig) -> None:
    """A named caller's ids are its own wherever its replies go (a client that came back
    on a new reply topic still has its retry recognised, and its reuse refused)."""
    body = {"caller": "hall", "id": "h1", "tool": "busy", "arguments": {"n": 1}}
    first = await send(rig, body, "tb/reply/one")
    again = await send(rig, body, "tb/reply/two")
    assert again["replayed"] is True and again["result"] == first["result"]
    assert rig.probe.calls == 1
    other = {**body, "arguments": {"n": 2}}
    assert_id_reused(await send(rig, other, "tb/reply/two"))


# -- callers that name no one -----------------------------------------------------------


async def test_two_anonymous_clients_never_share_an_id(rig: Rig) -> None:
    """Client D reusing client C's id gets its own answer, never C's result; even asking
    the same thing, it runs (no record is shared between reply topics)."""
    c_body = {"id": "anon-1", "tool": "echo", "arguments": {"text": "c-secret"}}
    c = await send(rig, c_body, "tb/reply/c")
    d_body = {"id": "anon-1", "tool": "echo", "arguments": {"text": "d-text"}}
    d = await send(rig, d_body, "tb/reply/d")
    assert c["result"]["structured"]["text"] == "c-secret"
    assert d["ok"] and d["replayed"] is False
    assert d["result"]["structured"]["text"] == "d-text"
    for topic in ("tb/reply/c", "tb/reply/d"):
        body = {"id": "anon-2", "tool": "busy", "arguments": {"n": 1}}
        assert (await send(rig, body, topic))["replayed"] is False
    assert rig.probe.calls == 2
    # Each one's own repeat is still a repeat.
    again = await send(rig, {"id": "anon-2", "tool": "busy", "arguments": {"n": 1}}, "tb/reply/c")
    assert again["replayed"] is True and rig.probe.calls == 2


async def test_anonymous_calls_without_a_reply_topic_share_no_ids(rig: Rig) -> None:
    """Three publishers, none naming a caller or a reply topic, each sending id `1`: no
    client owns such an id, so none is deduplicated (the second used to be silenced as
    a repeat, the third dead-lettered `id_reused`)."""
    for n in (1, 1, 2):
        body = {"id": "1", "tool": "busy", "arguments": {"n": n}}
        await rig.request(None, body, response_topic=None)
    assert rig.probe.calls == 3
    assert rig.dead() == []


# -- providers' call ids ----------------------------------------------------------------


def tool_message(reply: dict[str, Any]) -> tuple[str, Any]:
    """A Chat Completions answer's one tool message: its call id and its content."""
    [message] = reply["append"]
    return message["tool_call_id"], json.loads(message["content"])


async def test_an_openai_call_id_numbered_again_next_turn_runs_the_new_call(rig: Rig) -> None:
    """OpenAI-compatible servers number each response's calls `call_0`, ...: turn 2's
    `call_0` asking `datetime` runs, and is not turn 1's `echo` replayed."""
    turn_1 = await send(rig, chat_completion(("call_0", "echo", '{"text": "turn one"}')))
    turn_2 = await send(rig, chat_completion(("call_0", "datetime", "{}")))
    assert tool_message(turn_1) == ("call_0", {"text": "turn one", "data": None})
    call_id, content = tool_message(turn_2)
    assert call_id == "call_0" and set(content) >= {"iso", "timezone", "weekday"}
    assert [r["replayed"] for r in turn_2["results"]] == [False]
    # Turn 2 took the id's record: its own retry is a repeat, answered from it.
    retry = await send(rig, chat_completion(("call_0", "datetime", "{}")))
    assert [r["replayed"] for r in retry["results"]] == [True]
    assert tool_message(retry) == tool_message(turn_2)


async def test_a_later_turn_asking_what_an_earlier_one_did_runs_again(rig: Rig) -> None:
    """Light on (`call_0`), off (`call_1`), on again (`call_0`, the same arguments): the
    third turn is a new message and runs; it used to be turn 1's reply replayed, the light
    left off and the model told it was on. The same message sent again (its correlation
    data too: a retry, a redelivery) is still a repeat."""

    async def turn(call_id: str, n: int, correlation: bytes) -> dict[str, Any]:
        message = chat_completion((call_id, "busy", json.dumps({"n": n})))
        await rig.request(None, message, correlation=correlation)
        return rig.reply()

    on = await turn("call_0", 1, b"turn-1")
    off = await turn("call_1", 0, b"turn-2")
    on_again = await turn("call_0", 1, b"turn-3")
    assert [r["results"][0]["replayed"] for r in (on, off, on_again)] == [False] * 3
    assert rig.probe.calls == 3
    retry = await turn("call_0", 1, b"turn-3")
    assert retry["results"][0]["replayed"] is True and rig.probe.calls == 3


async def test_a_provider_call_id_beside_its_running_call_runs_unclaimed(rig: Rig) -> None:
    """Another conversation's `call_0` while this one's still runs: it runs at once,
    beside it; the running call keeps the record, so its own repeat is still known."""
    gate = chat_completion(("call_0", "gate", "{}")) | {"toolbus": OWN_REPLY}
    held = asyncio.create_task(rig.request(None, gate), name="held")
    await rig.probe.wait_active(1)
    busy = chat_completion(("call_0", "busy", '{"n": 5}')) | {"toolbus": OWN_REPLY}
    async with asyncio.timeout(10):  # while the gate is still shut
        other = await send(rig, busy, "tb/reply/other")
    assert other["ok"] and other["replayed"] is False
    assert other["result"]["structured"] == {"n": 5}
    rig.probe.release.set()
    async with asyncio.timeout(10):
        await held
    assert rig.reply()["replayed"] is False
    assert (await send(rig, gate))["replayed"] is True
    assert rig.probe.calls == 2


async def test_an_orphaned_run_of_another_request_is_not_in_doubt(
    redis_server: RedisServer,
) -> None:
    """A run cut short by a dead worker is in doubt for its own repeats only: another
    request under its id is refused (`id_reused`), or runs under a provider's id."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    asked = fingerprint("busy", {"n": 1, "hold_ms": 5.0})  # normalized: defaults filled in
    async with RedisStore(redis_server.url, "w-dead", prefix=prefix) as dead:
        for ident in ("d1", "call_7"):
            await dead.claim(anonymous_key(ident), 60.0, fingerprint=asked)
    rig = standard_rig(store=open_store(redis_server.url, "w2", prefix=prefix))
    async with rig.pipeline:
        same = await send(rig, {"id": "d1", "tool": "BUSY", "arguments": {"n": 1}})
        other = await send(rig, {"id": "d1", "tool": "busy", "arguments": {"n": 2}})
        provider = chat_completion(("call_7", "busy", '{"n": 3}')) | {"toolbus": OWN_REPLY}
        runs = await send(rig, provider)
    assert same["error"]["code"] == "in_doubt"  # its own repeat: in doubt, as before
    assert_id_reused(other)
    assert runs["ok"] and runs["result"]["structured"] == {"n": 3}
    assert rig.probe.calls == 1


class NeverSettles:
    """MCP servers still starting, for good; counts the waits for them."""

    def __init__(self) -> None:
        self.waits = 0

    def unsettled(self) -> list[str]:
        return ["slow"]

    def states(self) -> dict[str, str]:
        return {"slow": "starting"}

    async def wait_settled(self) -> None:
        self.waits += 1
        await asyncio.Event().wait()  # never: the caller's deadline ends the wait


async def test_a_reused_id_whose_tool_is_not_known_yet_waits_once_then_is_unavailable(
    rig: Rig,
) -> None:
    """What a call asks for is known only once its tool is: a tool of a server still
    starting is waited for (once, within the call's deadline), and the id's record, of
    another request, is not replayed meanwhile."""
    assert (await send(rig, {"id": "w1", "tool": "echo", "arguments": {"text": "x"}}))["ok"]
    starting = NeverSettles()
    rig.pipeline.executor._startup = starting  # a server that never comes up
    body = {"id": "w1", "tool": "slow_tool", "arguments": {}, "timeout_s": 0.2}
    reply = await send(rig, body)
    assert reply["error"]["code"] == "unavailable" and reply.get("result") is None
    assert reply["replayed"] is False and starting.waits == 1


# -- a reply never carries another request's result ------------------------------------

# What a request may ask for, and what it asks as the worker compares it: the canonical
# tool and the normalized arguments (`Echo` is `echo`; 7 as text is "7").
ASKS: list[tuple[str, dict[str, Any], tuple[str, str]]] = [
    ("echo", {"text": "x"}, ("echo", "x")),
    ("Echo", {"text": "x"}, ("echo", "x")),
    ("echo", {"text": "y"}, ("echo", "y")),
    ("echo", {"text": 7}, ("echo", "7")),
    ("ECHO", {"text": "7"}, ("echo", "7")),
    ("busy", {"n": 1}, ("busy", "1")),
    ("busy", {"n": 2}, ("busy", "2")),
]

requests = st.lists(
    st.tuples(
        st.sampled_from([None, None, "hall", "porch"]),  # caller (most name none)
        st.sampled_from(["tb/reply/c", "tb/reply/d"]),  # reply topic
        st.sampled_from(["a", "call_0"]),  # id: few, so that they collide
        st.sampled_from(range(len(ASKS))),  # tool and arguments
        st.booleans(),  # the id is a provider's call id (else the envelope's)
    ),
    min_size=1,
    max_size=12,
)


def body_of(caller: str | None, ident: str, ask: int, provider: bool) -> dict[str, Any]:
    tool, arguments, _ = ASKS[ask]
    if provider:
        options = {**OWN_REPLY, **({"caller": caller} if caller else {})}
        return chat_completion((ident, tool, json.dumps(arguments))) | {"toolbus": options}
    return {"id": ident, "tool": tool, "arguments": arguments, "caller": caller}


def compared(ask: int, provider: bool, correlation: bytes) -> tuple[str, str, bytes | None]:
    """What the worker compares: the ask, and for a provider's id the message it came in
    (its correlation data), since providers reuse their ids turn after turn."""
    return (*ASKS[ask][2], correlation if provider else None)


def own_result(reply: dict[str, Any], asked: tuple[str, str]) -> bool:
    """Does the reply carry what this request's own run returns?"""
    structured = reply["result"]["structured"]
    tool, value = asked
    expected = {"text": value, "data": None} if tool == "echo" else {"n": int(value)}
    return bool(structured == expected)


@pytest.mark.parametrize("kind", ["memory", "redis"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=requests)
async def test_a_reply_never_carries_another_request_s_result(
    kind: str, redis_server: RedisServer, sequence: list[tuple[str | None, str, str, int, bool]]
) -> None:
    """Random (caller, reply topic, id, tool, arguments) sequences against a model of the
    promise: a repeat (same key, same ask; for a provider's id, the same message too) is
    replayed, another ask under an id of the caller's is `id_reused`, under a provider's
    id it runs and takes the record. Every message here carries the same correlation
    data, as a client's retries do."""
    rig = standard_rig(store=store_for(kind, redis_server))
    records: dict[tuple[str, str], tuple[str, str, bytes | None]] = {}  # key: its record's
    runs = 0
    async with rig.pipeline:
        for caller, topic, ident, ask, provider in sequence:
            reply = await send(rig, body_of(caller, ident, ask, provider), topic)
            asked = compared(ask, provider, CORRELATION)
            key = (caller or f"\x1f{topic}", ident)
            held = records.get(key)
            if held is not None and held != asked and not provider:
                assert_id_reused(reply)
                continue
            assert reply["ok"] and own_result(reply, ASKS[ask][2]), (reply, asked)
            assert reply["replayed"] is (held == asked)
            if held != asked:
                records[key] = asked
                runs += asked[0] == "busy"
    assert rig.probe.calls == runs


@pytest.mark.parametrize("kind", ["memory", "redis"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=requests)
async def test_at_once_a_reply_still_never_carries_another_request_s_result(
    kind: str, redis_server: RedisServer, sequence: list[tuple[str | None, str, str, int, bool]]
) -> None:
    """The same sequences sent all at once: repeats wait for running calls, reuses meet
    them mid-run. Which request claims first is the race's; what holds regardless is
    that each reply is its own request's result, a repeat's, or `id_reused`."""
    rig = standard_rig(store=store_for(kind, redis_server))
    async with rig.pipeline:
        await asyncio.gather(
            *(
                rig.request(
                    None,
                    body_of(caller, ident, ask, provider),
                    response_topic=topic,
                    correlation=str(n).encode(),
                )
                for n, (caller, topic, ident, ask, provider) in enumerate(sequence)
            )
        )
    replies = {out.correlation_data: json.loads(out.payload) for out in rig.sent.sent}
    assert len(replies) == len(sequence)
    keys = [((c or f"\x1f{t}"), i) for c, t, i, _, _ in sequence]
    asks = [
        compared(ask, provider, str(n).encode()) for n, (*_, ask, provider) in enumerate(sequence)
    ]
    for n, (_, _, _, ask, provider) in enumerate(sequence):
        reply, asked = replies[str(n).encode()], asks[n]
        others = [asks[m] for m in range(len(sequence)) if m != n and keys[m] == keys[n]]
        if not reply["ok"]:
            assert not provider and any(other != asked for other in others), reply
            assert_id_reused(reply)
            continue
        assert own_result(reply, ASKS[ask][2]), (reply, asked)
        if reply["replayed"]:
            assert asked in others  # a repeat of one of them, never of another ask


# -- replies too large to keep, through every shape ---------------------------------------


@pytest_asyncio.fixture(params=["memory", "redis"])
async def small_records(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[Rig]:
    """A rig whose records keep replies of at most 2 KiB whole (issue 29.1)."""
    probe = Probe()
    built = rig_for(
        probe_tools(probe),
        probe,
        store=store_for(request.param, redis_server),
        dedup_max_reply_bytes=2048,
        max_payload_bytes=65_536,
    )
    async with built.pipeline:
        yield built


BIG = json.dumps({"text": "big", "data": ["d" * 1900] * 3})  # a reply of ~6 KB


async def test_a_providers_message_sent_again_gets_each_large_result_as_not_kept(
    small_records: Rig,
) -> None:
    """An OpenAI message of two calls whose replies were too large to keep, sent again
    (the same correlation: a retry): each call answered `reply_not_kept`, replayed, in the
    provider's shape (a tool message per call that says so), and nothing runs again."""
    message = chat_completion(("call_a", "echo", BIG), ("call_b", "busy", '{"n": 1}'))
    await small_records.request(None, message, correlation=b"turn-1")
    first = small_records.reply()
    await small_records.request(None, message, correlation=b"turn-1")
    again = small_records.reply()
    assert [r["ok"] for r in first["results"]] == [True, True]
    codes = [r["error"]["code"] if r.get("error") else "ok" for r in again["results"]]
    assert codes == ["reply_not_kept", "ok"]  # busy's reply is small: kept whole
    assert [r["replayed"] for r in again["results"]] == [True, True]
    assert again["ok"] is False
    contents = [m["content"] for m in again["append"]]
    assert [m["tool_call_id"] for m in again["append"]] == ["call_a", "call_b"]
    assert contents[0].startswith("error (reply_not_kept)")
    assert small_records.probe.calls == 1  # busy ran once; echo's repeat never ran


async def test_a_311_callers_repeat_of_a_large_reply_is_answered_on_its_reply_to(
    small_records: Rig,
) -> None:
    body = {"id": "big-1", "reply_to": "tb/reply/old", "arguments": json.loads(BIG)}
    await small_records.request("echo", body, response_topic=None)
    first = small_records.reply("tb/reply/old")
    await small_records.request("echo", body, response_topic=None)
    again = small_records.reply("tb/reply/old")
    assert first["ok"] and first["result"]["structured"]["data"] == ["d" * 1900] * 3
    assert (again["id"], again["replayed"]) == ("big-1", True)
    assert again["error"]["code"] == "reply_not_kept"
    assert again["error"]["details"]["ok"] is True
