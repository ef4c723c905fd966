"""Many calls in one message, in-process: run together, one reply in the calls' order.

The messages are built by the providers' own SDKs (offline) and published as their
`model_dump()`; every `append` item is checked with the SDKs' own parameter types.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.calls.test_pipeline import REPLY, Rig, rig_for, unencodable
from tests.support.providers import anthropic_message, chat_completion, check, response, tool_use
from tests.support.tools import Probe, probe_tools
from toolbus.calls.inflight import Slots
from toolbus.dedup import MemoryStore
from toolbus.wire.contracts import ReplyFormat


def calls_rig(slots: int = 8, **overrides: Any) -> Rig:
    probe = Probe()
    return rig_for(
        probe_tools(probe),
        probe,
        slots=Slots(slots),
        tools={"sleepy": {"timeout_s": 0.1}},
        **overrides,
    )


async def run(rig: Rig, body: dict[str, Any] | list[Any]) -> dict[str, Any]:
    await rig.request(None, json.dumps(body).encode())
    return rig.reply()


TOOLBUS_FORMAT = {"reply_format": "toolbus"}  # results with the calls' results in them


def codes(reply: dict[str, Any]) -> list[str | None]:
    return [(r.get("error") or {}).get("code") for r in reply["results"]]


async def test_an_anthropic_message_runs_each_tool_use_and_answers_once() -> None:
    rig = calls_rig()
    reply = await run(
        rig,
        anthropic_message(
            tool_use("toolu_a", "echo", {"text": "one"}),
            tool_use("toolu_b", "busy", {"n": 2, "hold_ms": 1}),
        ),
    )
    assert (reply["id"], reply["format"], reply["ok"]) == ("msg_01", "anthropic", True)
    assert [r["id"] for r in reply["results"]] == ["toolu_a", "toolu_b"]
    [message] = reply["append"]
    check(ReplyFormat.ANTHROPIC, message)
    assert message["role"] == "user"
    assert [b["tool_use_id"] for b in message["content"]] == ["toolu_a", "toolu_b"]


@pytest.mark.parametrize("count", [1, 2, 5])
async def test_the_calls_of_a_message_run_at_once(count: int) -> None:
    rig = calls_rig(slots=8)
    blocks = [tool_use(f"toolu_{n}", "gate", {}) for n in range(count)]
    handled = asyncio.create_task(rig.request(None, json.dumps(blocks).encode()), name="msg")
    await rig.probe.wait_active(count, timeout_s=5)  # all of them running together
    rig.probe.release.set()
    await asyncio.wait_for(handled, 5)
    reply = rig.reply()
    assert codes(reply) == [None] * count and reply["ok"] is True
    assert [r["id"] for r in reply["results"]] == [f"toolu_{n}" for n in range(count)]


async def test_with_no_free_slot_the_calls_run_one_after_another_in_order() -> None:
    rig = calls_rig(slots=0)
    blocks = [tool_use(f"toolu_{n}", "busy", {"n": n, "hold_ms": 2}) for n in range(4)]
    reply = await run(rig, {"content": blocks, "role": "assistant", "toolbus": TOOLBUS_FORMAT})
    assert rig.probe.max_active == 1
    assert [r["result"]["structured"]["n"] for r in reply["results"]] == [0, 1, 2, 3]


async def test_never_more_calls_at_once_than_the_free_slots_allow() -> None:
    rig = calls_rig(slots=2)
    blocks = [tool_use(f"toolu_{n}", "busy", {"n": n, "hold_ms": 5}) for n in range(6)]
    await run(rig, blocks)
    assert rig.probe.max_active == 3  # the message's own lane and two borrowed


async def test_one_call_failing_never_fails_the_others() -> None:
    rig = calls_rig()
    reply = await run(
        rig,
        chat_completion(
            ("call_ok", "echo", '{"text": "fine"}'),
            ("call_args", "busy", '{"n": "not a number at all"}'),
            ("call_unknown", "no_such_tool_anywhere", "{}"),
            ("call_slow", "sleepy", "{}"),
            ("call_json", "echo", "{broken"),
        ),
    )
    assert reply["format"] == "openai" and reply["ok"] is False
    assert codes(reply) == [None, "invalid_arguments", "unknown_tool", "timeout", "bad_request"]
    assert [m["tool_call_id"] for m in reply["append"]] == [
        "call_ok",
        "call_args",
        "call_unknown",
        "call_slow",
        "call_json",
    ]
    for message in reply["append"]:
        check(ReplyFormat.OPENAI, message)


async def test_a_responses_output_list_answers_with_function_call_outputs() -> None:
    rig = calls_rig()
    body = response(("call_1", "echo", '{"text": "a"}'), ("call_2", "echo", '{"text": "b"}'))
    reply = await run(rig, body)
    assert (reply["id"], reply["format"]) == ("resp_1", "openai-responses")
    assert [item["call_id"] for item in reply["append"]] == ["call_1", "call_2"]
    for item in reply["append"]:
        check(ReplyFormat.OPENAI_RESPONSES, item)
        assert item["type"] == "function_call_output"
    # The output list alone, as a caller holding `response.output` publishes it:
    reply = await run(rig, body["output"])
    assert [item["call_id"] for item in reply["append"]] == ["call_1", "call_2"]


async def test_the_caller_may_ask_for_another_format() -> None:
    rig = calls_rig()
    body = anthropic_message(
        tool_use("toolu_a", "echo", {"text": "x"}), toolbus={"reply_format": "toolbus"}
    )
    reply = await run(rig, body)
    assert (reply["id"], reply["ok"]) == ("toolu_a", True)  # one call: our plain `Reply`
    assert "results" not in reply and "append" not in reply
    envelope = {"tool": "echo", "arguments": {"text": "x"}, "reply_format": "openai"}
    reply = await run(rig, envelope)
    assert reply["format"] == "openai" and len(reply["append"]) == 1


async def test_provider_fields_never_reach_our_options() -> None:
    """A provider's `caller`, and our option names at a provider shape's top level, mean
    nothing: only the `toolbus` object does."""
    rig = calls_rig(require_caller=True)
    body = anthropic_message(tool_use("toolu_a", "echo", {"text": "x"}), caller="kitchen")
    reply = await run(rig, body)
    # No caller named (the top-level `caller` is the provider's): refused whole.
    assert reply["error"]["details"]["reason"] == "caller_required"
    body = anthropic_message(tool_use("toolu_a", "echo", {"text": "x"}))
    body["toolbus"] = {"caller": "kitchen"}
    assert codes(await run(rig, body)) == [None]


async def test_calls_without_a_reply_address_make_one_dead_letter() -> None:
    rig = calls_rig()
    blocks = [
        tool_use("toolu_ok", "echo", {"text": "x"}),
        *(tool_use(f"toolu_bad{n}", "no_such_tool_anywhere", {}) for n in range(3)),
    ]
    await rig.request(None, json.dumps(blocks).encode(), response_topic=None)
    [letter] = rig.dead()  # one per message, whatever its size: no amplification
    assert letter["error"]["code"] == "unknown_tool"
    assert [c["id"] for c in letter["error"]["details"]["calls"]] == [
        "toolu_bad0",
        "toolu_bad1",
        "toolu_bad2",
    ]
    assert rig.sent.on(REPLY) == []


async def test_results_beside_append_carry_how_each_call_went_not_its_result_again() -> None:
    rig = calls_rig()
    reply = await run(rig, [tool_use("toolu_a", "echo", {"text": "x"}), tool_use("t_b", "x", {})])
    assert [set(r) & {"result", "ok", "duration_ms"} for r in reply["results"]] == [
        {"ok", "duration_ms"}
    ] * 2
    assert reply["results"][1]["error"]["code"] == "unknown_tool"


async def test_a_quota_judges_a_messages_calls_as_it_would_one_after_another() -> None:
    """An idle worker never refuses what a busy one would run: lanes stay within the
    caller's in-flight room."""
    rig = calls_rig(slots=8, callers={"*": {"max_in_flight": 2}})
    blocks = [tool_use(f"toolu_{n}", "busy", {"n": n, "hold_ms": 5}) for n in range(5)]
    reply = await run(rig, blocks)
    assert codes(reply) == [None] * 5
    assert rig.probe.max_active == 2


async def test_a_borrowed_slot_goes_back_when_its_lane_runs_dry() -> None:
    slots = Slots(3)
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, slots=slots)
    blocks = [tool_use("toolu_slow", "gate", {})] + [
        tool_use(f"toolu_{n}", "busy", {"n": n, "hold_ms": 1}) for n in range(3)
    ]
    handled = asyncio.create_task(rig.request(None, json.dumps(blocks).encode()), name="msg")
    await probe.wait_active(1, timeout_s=5)
    # The first lane (the message's own) holds the slow call; the borrowed ones end on
    # the empty queue once the fast calls are done.
    lanes = {t.get_name(): t for t in asyncio.all_tasks() if t.get_name().startswith("msg:")}
    assert sorted(lanes) == ["msg:lane0", "msg:lane1", "msg:lane2", "msg:lane3"]
    borrowed = [lanes["msg:lane1"], lanes["msg:lane2"], lanes["msg:lane3"]]
    await asyncio.wait(borrowed, timeout=5)
    assert probe.active == 1  # the slow call still runs
    assert await slots.borrow(3) == 3  # and every borrowed slot is free again
    slots.release(3)
    probe.release.set()
    await asyncio.wait_for(handled, 5)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([tool_use("same", "echo", {}), tool_use("same", "echo", {})], "duplicate_call_id"),
        ([tool_use(f"t{n}", "echo", {}) for n in range(5)], "too_many_calls"),
        ({"type": "message", "content": [{"type": "text", "text": "hi"}]}, "no_tool_calls"),
        ({"tool": "echo", "text": "hi"}, "arguments_not_nested"),
        ({"tool": "echo", "timeout_s": 1, "toolbus": {"timeout_s": 2}}, "conflicting_options"),
    ],
)
async def test_a_message_refused_whole_says_why(body: Any, reason: str) -> None:
    rig = calls_rig(max_calls_per_message=4)
    reply = await run(rig, body)
    assert reply["error"]["code"] == "bad_request"
    assert reply["error"]["details"]["reason"] == reason


async def test_a_repeated_message_replays_each_call() -> None:
    probe = Probe()
    rig = rig_for(
        probe_tools(probe), probe, store=MemoryStore("w1"), slots=Slots(4), publisher=None
    )
    blocks = [tool_use("toolu_1", "busy", {"n": 1, "hold_ms": 1}), tool_use("toolu_2", "echo", {})]
    body = {"content": blocks, "role": "assistant", "toolbus": TOOLBUS_FORMAT}
    first = await run(rig, body)
    again = await run(rig, body)
    assert probe.calls == 1  # busy ran once
    assert [r.get("replayed", False) for r in again["results"]] == [True, False]
    assert again["results"][0]["result"] == first["results"][0]["result"]


async def test_a_shutdown_answers_every_call_of_a_message_unavailable() -> None:
    slots, probe = Slots(1), Probe()
    rig = rig_for(probe_tools(probe), probe, slots=slots)
    blocks = [tool_use(f"toolu_{n}", "gate", {}) for n in range(4)]
    handled = asyncio.create_task(rig.request(None, json.dumps(blocks).encode()), name="msg")
    await probe.wait_active(2, timeout_s=5)  # two lanes: two calls running, two waiting
    rig.pipeline.stopping()
    handled.cancel()
    await asyncio.wait_for(handled, 5)
    reply = rig.reply()
    assert codes(reply) == ["unavailable"] * 4
    assert probe.calls == 2  # the waiting calls never started
    assert await slots.borrow(1) == 1  # and the borrowed slot went back


async def test_a_call_whose_reply_cannot_be_encoded_fails_alone() -> None:
    probe = Probe()
    rig = rig_for([*probe_tools(probe), unencodable], probe)
    body = [tool_use("toolu_bad", "unencodable", {}), tool_use("toolu_ok", "echo", {"text": "x"})]
    reply = await run(rig, body)
    assert codes(reply) == ["internal", None]
    assert rig.counted("toolbus.internal_errors", stage="encode") == 1
    check(ReplyFormat.ANTHROPIC, reply["append"][0])
