"""`toolbus.Client` answering what a tool asks (`on_input`, `on_sampling`) and a gate's
approvals (`on_approval`), round by round, over a real mosquitto.

The worker's side is `tests.support.asking_worker.AskingWorker`, a stand-in held to
the wire contract (continuations single-use, caller-bound, under new ids; answers that
MCP's own types accept): every test ends asserting it saw no violation.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.support.asking_worker import SAMPLING_REFUSED, AskingWorker, elicitation, sampling
from tests.support.harness import Broker
from toolbus import Client
from toolbus.wire.errors import ApprovalRequired, InputRequired

DEVICE = elicitation("Which Switch One?", device={"type": "string", "enum": ["hall", "porch"]})
SUMMARY = sampling("Summarize: the hall light is on.", system="Be brief.")


@pytest_asyncio.fixture
async def asking(broker: Broker) -> AsyncIterator[AskingWorker]:
    worker = AskingWorker(broker.url, f"ask{uuid.uuid4().hex[:8]}")
    async with worker.running():
        yield worker
    assert not worker.violations


def client_of(broker: Broker, worker: AskingWorker, **options: Any) -> Client:
    return Client(broker.url, prefix=worker.prefix, timeout_s=10, **options)


def completion(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": {"type": "text", "text": text},
        "model": "stand-in",
        "stopReason": "endTurn",
    }


async def test_an_elicitation_is_answered_by_on_input(broker: Broker, asking: AskingWorker) -> None:
    asking.questions["pick"] = [{"device": DEVICE}]
    seen: list[dict[str, Any]] = []

    async def on_input(params: dict[str, Any]) -> dict[str, Any]:
        seen.append(params)
        return {"action": "accept", "content": {"device": "porch"}}

    async with client_of(broker, asking, caller="kitchen") as client:
        reply = await client.call("pick", {"room": "hall"}, on_input=on_input)

    assert reply.result is not None and isinstance(reply.result.structured, dict)
    assert reply.result.structured["answers"] == [
        {"device": {"action": "accept", "content": {"device": "porch"}}}
    ]
    assert seen == [DEVICE["params"]]
    first, second = asking.requests
    assert first["input"] is True and first["tool"] == "pick" and first["caller"] == "kitchen"
    assert set(second) >= {"id", "continuation", "input_responses"}
    assert second["id"] != first["id"] and "tool" not in second and second["caller"] == "kitchen"
    assert asking.runs == [("pick", {"room": "hall"})]


async def test_rounds_follow_one_another_with_plain_functions(
    broker: Broker, asking: AskingWorker
) -> None:
    """Two rounds, the first asking twice; plain functions run off the event loop."""
    asking.questions["plan"] = [{"device": DEVICE, "summary": SUMMARY}, {"again": DEVICE}]
    threads: set[str] = set()

    def on_input(params: dict[str, Any]) -> dict[str, Any]:
        threads.add(threading.current_thread().name)
        return {"action": "accept", "content": {"device": "hall"}}

    def on_sampling(params: dict[str, Any]) -> dict[str, Any]:
        threads.add(threading.current_thread().name)
        assert params["systemPrompt"] == "Be brief." and params["maxTokens"] == 100
        return completion("The hall light is on.")

    async with client_of(broker, asking) as client:
        reply = await client.call("plan", on_input=on_input, on_sampling=on_sampling)

    assert reply.result is not None and isinstance(reply.result.structured, dict)
    accepted = {"action": "accept", "content": {"device": "hall"}}
    assert reply.result.structured["answers"] == [
        {"device": accepted, "summary": completion("The hall light is on.")},
        {"again": accepted},
    ]
    assert threading.main_thread().name not in threads
    assert len({body["id"] for body in asking.requests}) == 3  # a new id for each round


async def test_a_question_without_its_callback_is_answered_as_mcp_clients_do(
    broker: Broker, asking: AskingWorker
) -> None:
    """Only `on_input`: the sampling request is left unanswered (the server gets an
    error). Only `on_sampling`: the elicitation is declined."""
    asking.questions["both"] = [{"device": DEVICE, "summary": SUMMARY}]
    accept = {"action": "accept", "content": {"device": "hall"}}
    async with client_of(broker, asking) as client:
        only_input = await client.call("both", on_input=lambda _: accept)
        only_sampling = await client.call("both", on_sampling=lambda _: completion("on"))
    assert only_input.result is not None and only_sampling.result is not None
    assert only_input.result.structured == {
        "answers": [{"device": accept, "summary": SAMPLING_REFUSED}]
    }
    assert only_sampling.result.structured == {
        "answers": [{"device": {"action": "decline"}, "summary": completion("on")}]
    }


async def test_without_callbacks_nothing_changes(broker: Broker, asking: AskingWorker) -> None:
    """No `input: true`: the worker declines for the caller, and a gated call raises
    `ApprovalRequired`, its token in `details`."""
    asking.questions["pick"] = [{"device": DEVICE}]
    asking.gated.add("wipe")
    async with client_of(broker, asking) as client:
        reply = await client.call("pick")
        with pytest.raises(ApprovalRequired) as refused:
            await client.call("wipe", {"disk": "b"})
    assert "input" not in asking.requests[0]
    assert reply.result is not None
    assert reply.result.structured == {"answers": [{"device": {"action": "decline"}}]}
    assert refused.value.details["call"] == {"tool": "wipe", "arguments": {"disk": "b"}}
    assert isinstance(refused.value.details["approval"], str)
    assert asking.runs == [("pick", {})]


async def test_rounds_are_bounded_and_the_last_can_be_driven_by_hand(
    broker: Broker, asking: AskingWorker
) -> None:
    asking.questions["long"] = [{"q": DEVICE}] * 3
    accept = {"action": "accept", "content": {"device": "hall"}}
    async with client_of(broker, asking) as client:
        with pytest.raises(InputRequired) as left:
            await client.call("long", on_input=lambda _: accept, max_rounds=2)
        details = left.value.details
        assert set(details["input_requests"]) == {"q"} and details["expires_in_s"] > 0
        last = await client.request(
            f"{asking.prefix}/call",
            {
                "id": uuid.uuid4().hex,
                "continuation": details["continuation"],
                "input_responses": {"q": accept},
            },
        )
    assert last.ok
    assert asking.runs == [("long", {})]


async def test_an_approved_call_runs_once_and_a_refused_one_never(
    broker: Broker, asking: AskingWorker
) -> None:
    asking.gated.add("wipe")
    asking.questions["wipe"] = [{"device": DEVICE}]  # approved, it then asks
    shown: list[dict[str, Any]] = []

    async def approve(call: dict[str, Any]) -> bool:
        shown.append(call)
        return bool(call["arguments"] == {"disk": "b"})

    accept = {"action": "accept", "content": {"device": "porch"}}
    async with client_of(broker, asking) as client:
        reply = await client.call(
            "wipe", {"disk": "b"}, on_approval=approve, on_input=lambda _: accept
        )
        with pytest.raises(ApprovalRequired) as refused:
            await client.call("wipe", {"disk": "a"}, on_approval=approve)
    assert reply.ok
    assert shown == [
        {"tool": "wipe", "arguments": {"disk": "b"}},
        {"tool": "wipe", "arguments": {"disk": "a"}},
    ]
    assert asking.runs == [("wipe", {"disk": "b"})]
    assert refused.value.details["call"] == shown[1]
    approved = asking.requests[1]
    assert approved["approval"] and approved["id"] != asking.requests[0]["id"]


async def test_a_callback_that_fails_fails_the_call(broker: Broker, asking: AskingWorker) -> None:
    asking.questions["pick"] = [{"device": DEVICE}]

    def wrong(_: dict[str, Any]) -> dict[str, Any]:
        return {"action": "maybe"}

    async with client_of(broker, asking) as client:
        with pytest.raises(ValueError, match="ElicitResult"):
            await client.call("pick", on_input=wrong)


async def test_a_call_cancelled_while_its_question_waits_is_cancelled_at_the_workers(
    broker: Broker, asking: AskingWorker
) -> None:
    """Cancelled in its second round: the cancel names the request that got the question
    (the first round's continuation), as docs/topics.md has it."""
    asking.questions["pick"] = [{"device": DEVICE}, {"again": DEVICE}]
    asked = asyncio.Event()

    async def second_never(params: dict[str, Any]) -> dict[str, Any]:
        if asked.is_set():
            raise AssertionError("asked a third time")
        if len(asking.requests) == 1:
            return {"action": "accept", "content": {"device": "hall"}}
        asked.set()
        await asyncio.Event().wait()  # the person never answers this one
        raise AssertionError("unreachable")

    async with client_of(broker, asking, caller="kitchen") as client:
        call = asyncio.create_task(client.call("pick", id="pick-1", on_input=second_never))
        async with asyncio.timeout(10):
            await asked.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        async with asyncio.timeout(10):
            await asking.cancelled.wait()
    first, continued = asking.requests
    assert first["id"] == "pick-1"
    assert asking.cancels == [{"id": continued["id"], "caller": "kitchen"}]
    assert asking.runs == []


async def test_a_models_tool_calls_go_round_too(broker: Broker, asking: AskingWorker) -> None:
    """An Anthropic message of three calls, two asking: `append` holds every call's end,
    and the two calls' questions are put one at a time."""
    asking.questions["pick"] = [{"device": DEVICE}]
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "pick", "input": {"room": "hall"}},
            {"type": "tool_use", "id": "toolu_2", "name": "plain", "input": {}},
            {"type": "tool_use", "id": "toolu_3", "name": "pick", "input": {"room": "porch"}},
        ],
    }
    asked_at_once, most = 0, 0

    async def on_input(params: dict[str, Any]) -> dict[str, Any]:
        nonlocal asked_at_once, most
        asked_at_once += 1
        most = max(most, asked_at_once)
        for _turn in range(3):
            await asyncio.sleep(0)  # room for the other call's question to come in
        asked_at_once -= 1
        return {"action": "accept", "content": {"device": "hall"}}

    async with client_of(broker, asking, caller="kitchen") as client:
        answer = await client.run_tool_calls_reply(message, on_input=on_input)
    assert answer.ok and [r.ok for r in answer.results] == [True, True, True]
    assert most == 1
    (user,) = answer.append
    blocks = user["content"]
    assert isinstance(blocks, list)
    assert [(b["tool_use_id"], b.get("is_error")) for b in blocks if isinstance(b, dict)] == [
        ("toolu_1", None),
        ("toolu_2", None),
        ("toolu_3", None),
    ]
    assert blocks[0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "done"}],
    }
    first, *continued = asking.requests
    assert first["toolbus"]["input"] is True
    assert len(continued) == 2
    assert all(body["caller"] == "kitchen" and "continuation" in body for body in continued)
    assert sorted(asking.runs, key=repr) == [
        ("pick", {"room": "hall"}),
        ("pick", {"room": "porch"}),
        ("plain", {}),
    ]


async def test_topic_identity_continues_on_the_callers_topic(broker: Broker) -> None:
    asking = AskingWorker(broker.url, f"ask{uuid.uuid4().hex[:8]}", caller_in_topic=True)
    asking.questions["pick"] = [{"device": DEVICE}]
    accept = {"action": "accept", "content": {"device": "hall"}}
    async with asking.running():
        client = client_of(broker, asking, caller="kitchen", caller_identity="topic")
        async with client:
            reply = await client.call("pick", on_input=lambda _: accept)
    assert reply.ok and not asking.violations
    assert asking.runs == [("pick", {})]
    prefix = asking.prefix
    assert asking.topics == [f"{prefix}/call/kitchen/pick", f"{prefix}/call/kitchen"]
