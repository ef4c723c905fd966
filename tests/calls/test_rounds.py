"""Rounds in-process: a tool that asks its caller (held on this worker), answered with a
continuation; the token's rules (single-use, bound to its caller, expiry), dedup of
both rounds, a cancel while the call waits, and a caller that cannot answer.

The tool is local (`toolbus.elicit`): the held path is the one an MCP server before
2026-07-28 takes (tests/mcp/test_input_relay.py runs real servers of both generations).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.harness import ListPublisher
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.backends.local.functions import elicit, tool
from toolbus.calls.quotas import Quotas
from toolbus.calls.rounds import MAX_ENDING_CHARS, Rounds, RoundsSettings
from toolbus.calls.running import RunningCalls
from toolbus.config import Settings
from toolbus.dedup import MemoryStore, Once
from toolbus.dedup.store import KEY_SEP
from toolbus.dedup.tasks import MemoryTasks
from toolbus.dedup.tokens import ENDED, MemoryTokens, TokenRecord, TokenStore, holder_of
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.wire.asking import InputRequest
from toolbus.wire.errors import InputRequired
from toolbus.wire.messages import Inbound
from toolbus.worker.wiring import build_executor, build_registry, topics_for

REPLY = "tb/reply/r1"
SCHEMA = {"type": "object", "properties": {"choice": {"type": "string"}}}
ACCEPT = {"action": "accept", "content": {"choice": "lamp"}}

started: list[str] = []  # each run of `which` (a run twice shows here)


@tool
async def which(room: str) -> dict[str, Any]:
    """Asks which device, then switches it."""
    started.append(room)
    answer = await elicit(f"Which device in {room}?", SCHEMA)
    content = answer.get("content") or {}
    return {"action": answer["action"], "choice": content.get("choice"), "room": room}


@tool
async def stalls() -> str:
    """Asks, then never ends (a server that hangs after its question is declined)."""
    await elicit("Anything?", SCHEMA)
    await asyncio.Event().wait()
    return "never"


@tool
async def big() -> str:
    """Asks, then answers with more than a held call's end kept whole in memory."""
    await elicit("Anything?", SCHEMA)
    return "x" * (MAX_ENDING_CHARS + 1000)


@tool
async def twice() -> dict[str, Any]:
    """Asks two questions, one after the other."""
    first = await elicit("First?", SCHEMA)
    second = await elicit("Second?", SCHEMA)
    return {"first": first.get("content"), "second": second.get("content")}


class Rig:
    def __init__(
        self,
        tracer: trace.Tracer | None = None,
        tokens: TokenStore | None = None,
        **overrides: Any,
    ) -> None:
        settings = Settings.model_validate(
            {"topic_prefix": "tb", "tools": {"which": {"timeout_s": 0.5}}, **overrides}
        )
        registry = build_registry([*BUILTIN_TOOLS, which, twice, stalls, big], settings)
        executor = build_executor(settings, registry, tracer=tracer)
        self.sent = ListPublisher()
        self.pipeline = Pipeline(
            executor,
            topics_for(settings),
            self.sent,
            worker_id="w1",
            max_payload_bytes=settings.max_payload_bytes,
            dead_letter_max_bytes=settings.dead_letter_max_bytes,
            tracer=tracer,
            once=Once(MemoryStore("w1"), 60.0, executor.idempotent),
            quotas=Quotas(settings.callers),
            task_store=MemoryTasks("w1"),
            rounds=RoundsSettings(
                input_timeout_s=settings.input_timeout_s, max_open=settings.input_max_open
            ),
            token_store=tokens,
        )

    async def call(
        self,
        body: dict[str, Any],
        reply_topic: str = REPLY,
        topic: str = "tb/call",
        **inbound: Any,
    ) -> dict[str, Any]:
        """One request; its reply (every wait bounded)."""
        before = len(self.sent.on(reply_topic))
        message = Inbound(
            topic=topic,
            payload=json.dumps(body).encode(),
            response_topic=reply_topic,
            correlation_data=b"c",
            **inbound,
        )
        await asyncio.wait_for(self.pipeline.handle(message), 5)
        replies = self.sent.on(reply_topic)
        assert len(replies) == before + 1, replies
        return dict(json.loads(replies[-1].payload))


@pytest.fixture
async def rig() -> Any:
    started.clear()
    rig = Rig()
    async with rig.pipeline:
        yield rig


def asked(reply: dict[str, Any]) -> str:
    assert reply["ok"] is False, reply
    assert reply["error"]["code"] == "input_required", reply
    [(key, question)] = reply["error"]["details"]["input_requests"].items()
    assert key == "elicitation" and question["method"] == "elicitation/create"
    assert question["params"]["requestedSchema"] == SCHEMA
    token = reply["error"]["details"]["continuation"]
    assert isinstance(token, str) and token
    return token


async def test_a_question_is_answered_with_a_continuation_and_the_call_goes_on(rig: Rig) -> None:
    first = await rig.call(
        {"id": "r1", "tool": "which", "arguments": {"room": "hall"}, "input": True}
    )
    token = asked(first)
    assert first["id"] == "r1" and first["tool"] == "which"
    final = await rig.call(
        {"id": "r2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert final["ok"] is True and final["id"] == "r2" and final["tool"] == "which"
    assert final["result"]["structured"] == {"action": "accept", "choice": "lamp", "room": "hall"}
    assert started == ["hall"]  # one run across both rounds


async def test_a_caller_that_cannot_answer_gets_the_tools_own_answer(rig: Rig) -> None:
    reply = await rig.call({"id": "n1", "tool": "which", "arguments": {"room": "hall"}})
    assert reply["ok"] is True
    assert reply["result"]["structured"]["action"] == "decline"


async def test_the_v5_user_property_asks_for_input_too(rig: Rig) -> None:
    message = Inbound(
        topic="tb/call",
        payload=json.dumps({"id": "p1", "tool": "which", "arguments": {"room": "a"}}).encode(),
        response_topic=REPLY,
        correlation_data=b"c",
        user_properties=(("toolbus-input", "1"),),
    )
    await asyncio.wait_for(rig.pipeline.handle(message), 5)
    asked(json.loads(rig.sent.on(REPLY)[-1].payload))


async def test_a_token_is_single_use_and_a_copy_of_its_request_replays(rig: Rig) -> None:
    token = asked(
        await rig.call({"id": "s1", "tool": "which", "arguments": {"room": "x"}, "input": True})
    )
    body = {"id": "s2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    final = await rig.call(body)
    assert final["ok"] is True
    again = await rig.call(body)  # a redelivery or a retry of the same request
    assert again["replayed"] is True and again["result"] == final["result"]
    other = await rig.call({**body, "id": "s3"})  # another request with the used token
    assert other["error"]["code"] == "continuation_invalid"
    assert other["error"]["details"]["reason"] == "used"
    # The first round's copy gets the first round's answer: its token, now used.
    first = await rig.call({"id": "s1", "tool": "which", "arguments": {"room": "x"}, "input": True})
    assert first["replayed"] is True and asked(first) == token
    assert started == ["x"]


async def test_a_token_is_bound_to_its_caller(rig: Rig) -> None:
    body = {
        "id": "b1",
        "tool": "which",
        "arguments": {"room": "x"},
        "input": True,
        "caller": "alice",
    }
    token = asked(await rig.call(body))
    steal = {"id": "b2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    for thief in ({**steal, "caller": "mallory"}, steal):  # another caller; an anonymous one
        refused = await rig.call(thief, reply_topic="tb/reply/m")
        assert refused["error"]["code"] == "continuation_invalid"
        assert refused["error"]["details"]["reason"] == "unknown"
    final = await rig.call({**steal, "caller": "alice"})
    assert final["ok"] is True and final["result"]["structured"]["choice"] == "lamp"


async def test_a_continuation_takes_an_id_of_its_own(rig: Rig) -> None:
    token = asked(
        await rig.call({"id": "i1", "tool": "which", "arguments": {"room": "x"}, "input": True})
    )
    same = await rig.call(
        {"id": "i1", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert (
        same["error"]["code"] == "bad_request" and same["error"]["details"]["reason"] == "id_reused"
    )
    final = await rig.call(
        {"id": "i2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert final["ok"] is True  # the refusal did not use the token up


async def test_unknown_tokens_are_refused(rig: Rig) -> None:
    reply = await rig.call({"id": "u1", "continuation": "c.nothing", "input_responses": {}})
    assert reply["error"]["code"] == "continuation_invalid"
    assert reply["error"]["details"]["reason"] == "unknown"


async def test_two_questions_are_two_rounds(rig: Rig) -> None:
    first = await rig.call({"id": "t1", "tool": "twice", "input": True})
    second = await rig.call(
        {
            "id": "t2",
            "continuation": asked(first),
            "input_responses": {"elicitation": ACCEPT},
            "input": True,
        }
    )
    other = {"action": "accept", "content": {"choice": "fan"}}
    final = await rig.call(
        {"id": "t3", "continuation": asked(second), "input_responses": {"elicitation": other}}
    )
    assert final["result"]["structured"] == {
        "first": {"choice": "lamp"},
        "second": {"choice": "fan"},
    }


async def test_the_deadline_stops_while_the_caller_thinks(rig: Rig) -> None:
    """`which` has a 0.5 s deadline; the caller answers after it would have passed."""
    token = asked(
        await rig.call({"id": "d1", "tool": "which", "arguments": {"room": "x"}, "input": True})
    )
    await asyncio.sleep(0.7)  # the caller thinking, past the tool's deadline
    final = await rig.call(
        {"id": "d2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert final["ok"] is True, final


async def test_a_call_waiting_for_its_caller_can_be_cancelled(rig: Rig) -> None:
    token = asked(
        await rig.call({"id": "k1", "tool": "which", "arguments": {"room": "x"}, "input": True})
    )
    key = Once.key(None, REPLY, "k1")
    assert key is not None
    assert await rig.pipeline._answerer.cancel(key)  # the caller's cancel names the first id
    async with asyncio.timeout(5):
        while rig.pipeline.rounds.held(token) is not None or len(rig.pipeline.running):
            await asyncio.sleep(0.005)  # polled, bounded: the call has ended
    late = await rig.call(
        {"id": "k2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert late["id"] == "k2" and late["error"]["code"] == "cancelled", late
    assert late["error"]["details"]["started"] is True


async def test_past_input_timeout_the_tool_is_declined_and_its_answer_kept() -> None:
    started.clear()
    rig = Rig(input_timeout_s=0.2)
    async with rig.pipeline:
        token = asked(
            await rig.call({"id": "e1", "tool": "which", "arguments": {"room": "x"}, "input": True})
        )
        async with asyncio.timeout(5):
            while rig.pipeline.rounds.held(token) is not None or len(rig.pipeline.running):
                await asyncio.sleep(0.01)  # polled, bounded: declined for the caller, ended
        late = await rig.call(
            {"id": "e2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
        )
    assert late["ok"] is True and late["result"]["structured"]["action"] == "decline"


async def test_a_call_waiting_for_its_caller_holds_no_slot_of_its_callers_quota() -> None:
    """Decided: the request that asked was answered, so the caller's `max_in_flight`
    is free for its next call while the first waits (a held server keeps its own slot)."""
    started.clear()
    rig = Rig(callers={"alice": {"max_in_flight": 1}})
    async with rig.pipeline:
        body = {"tool": "which", "arguments": {"room": "x"}, "input": True, "caller": "alice"}
        token = asked(await rig.call({"id": "q1", **body}))
        other = await rig.call(
            {"id": "q2", "tool": "echo", "arguments": {"text": "hi"}, "caller": "alice"}
        )
        assert other["ok"] is True, other
        final = await rig.call(
            {
                "id": "q3",
                "caller": "alice",
                "continuation": token,
                "input_responses": {"elicitation": ACCEPT},
            }
        )
        assert final["ok"] is True


async def test_one_callers_open_questions_are_bounded_and_cost_only_that_caller() -> None:
    """Each held call keeps its server's request open: at most `input_max_open` of one
    caller's wait at once; past it the question fails for that caller alone, as toolbus's
    (`input_unrelayed`), never as a `decline` the caller did not give."""
    started.clear()
    rig = Rig(input_max_open=2)
    async with rig.pipeline:
        for n in range(2):
            asked(
                await rig.call(
                    {
                        "id": f"m{n}",
                        "tool": "which",
                        "arguments": {"room": "x"},
                        "input": True,
                        "caller": "mallory",
                    }
                )
            )
        over = await rig.call(
            {
                "id": "m2",
                "tool": "which",
                "arguments": {"room": "x"},
                "input": True,
                "caller": "mallory",
            }
        )
        assert over["error"]["code"] == "tool_error", over
        details = over["error"]["details"]
        assert details["reason"] == "input_unrelayed" and details["refused"] == "rate_limited"
        # Another caller still gets its question.
        asked(
            await rig.call(
                {
                    "id": "a1",
                    "tool": "which",
                    "arguments": {"room": "x"},
                    "input": True,
                    "caller": "alice",
                }
            )
        )


async def test_a_provider_shaped_call_gets_its_question_in_its_result(rig: Rig) -> None:
    """An Anthropic tool_use block with `toolbus.input`: its call's reply in `results`
    carries the question and token; the continuation (our envelope) gets its end."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "which", "input": {"room": "den"}}
        ],
        "toolbus": {"input": True},
    }
    reply = await rig.call(message)
    assert reply["format"] == "anthropic" and reply["ok"] is False
    [result] = reply["results"]
    token = asked(result)
    [block] = reply["append"][0]["content"]
    assert block["tool_use_id"] == "toolu_1" and block["is_error"] is True
    final = await rig.call(
        {"id": "p2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert final["ok"] is True and final["result"]["structured"]["room"] == "den"


async def test_the_rounds_of_a_call_join_the_callers_trace(rig: Rig) -> None:
    """A caller that sends its trace context with each round gets each reply in it."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    header = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
    first = await rig.call(
        {"id": "tr1", "tool": "which", "arguments": {"room": "x"}, "input": True},
        user_properties=header,
    )
    final = await rig.call(
        {"id": "tr2", "continuation": asked(first), "input_responses": {"elicitation": ACCEPT}},
        user_properties=header,
    )
    assert first["trace_id"] == final["trace_id"] == trace_id


async def test_a_task_cannot_ask_its_questions_are_declined(rig: Rig) -> None:
    """Nobody waits on a task's reply to answer it: its tool gets `decline`."""
    body = {"id": "job", "tool": "which", "arguments": {"room": "x"}, "task": True, "input": True}
    message = Inbound(
        topic="tb/call",
        payload=json.dumps(body).encode(),
        response_topic=REPLY,
        correlation_data=b"c",
    )
    # Not `rig.call`: the task's end may be pushed before `handle` returns (a loaded machine).
    await asyncio.wait_for(rig.pipeline.handle(message), 5)
    working = json.loads(rig.sent.on(REPLY)[0].payload)
    assert working["type"] == "task" and working["status"] == "working"
    async with asyncio.timeout(5):
        while len(rig.sent.on(REPLY)) < 2:
            await asyncio.sleep(0.005)  # polled, bounded: the task's end is pushed
    end = json.loads(rig.sent.on(REPLY)[-1].payload)
    assert end["ok"] is True and end["result"]["structured"]["action"] == "decline", end


async def test_in_topic_mode_a_token_is_bound_to_the_caller_the_topic_proves() -> None:
    """`caller_identity = "topic"`: the broker's ACL lets a login publish only under its
    own `call/{caller}`; a continuation from another caller's topic continues nothing."""
    started.clear()
    rig = Rig(caller_identity="topic")
    async with rig.pipeline:
        alice, mallory = "tb/reply/alice/r", "tb/reply/mallory/r"
        body = {"id": "a1", "tool": "which", "arguments": {"room": "x"}, "input": True}
        token = asked(await rig.call(body, alice, topic="tb/call/alice"))
        steal = {"id": "m1", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
        refused = await rig.call(steal, mallory, topic="tb/call/mallory")
        assert refused["error"]["code"] == "continuation_invalid"
        assert refused["error"]["details"]["reason"] == "unknown"
        final = await rig.call({**steal, "id": "a2"}, alice, topic="tb/call/alice")
        assert final["ok"] is True


async def test_one_trace_holds_every_round_of_a_held_call() -> None:
    """The held call's `execute_tool` span lives from the first round to the end, in the
    first request's trace, with an event for each question and each answer (counts,
    never what they say); the continuing request's own spans join the trace it sends."""
    started.clear()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    rig = Rig(tracer=provider.get_tracer("test"))
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    header = (("traceparent", f"00-{trace_id}-b7ad6b7169203331-01"),)
    async with rig.pipeline:
        first = await rig.call(
            {"id": "o1", "tool": "which", "arguments": {"room": "x"}, "input": True},
            user_properties=header,
        )
        final = await rig.call(
            {"id": "o2", "continuation": asked(first), "input_responses": {"elicitation": ACCEPT}},
            user_properties=header,
        )
    assert final["ok"] is True
    [tool_span] = [s for s in spans.get_finished_spans() if s.name == "execute_tool which"]
    assert f"{tool_span.context.trace_id:032x}" == trace_id
    events = [(e.name, dict(e.attributes or {})) for e in tool_span.events]
    assert ("toolbus.input_required", {"toolbus.input.count": 1}) in events
    assert ("toolbus.input_answered", {"toolbus.input.count": 1}) in events
    assert all("lamp" not in str(attributes) for _, attributes in events)
    traces = {f"{s.context.trace_id:032x}" for s in spans.get_finished_spans()}
    assert traces == {trace_id}


async def test_a_cancel_naming_a_later_rounds_request_cancels_the_held_call(rig: Rig) -> None:
    """The caller knows the id of the request that got the latest question: a cancel
    naming it finds the held call as the first request's id does."""
    first = await rig.call({"id": "l1", "tool": "twice", "input": True})
    answers = {"elicitation": ACCEPT}
    second = await rig.call(
        {"id": "l2", "continuation": asked(first), "input_responses": answers, "input": True}
    )
    token = asked(second)
    key = Once.key(None, REPLY, "l2")
    assert key is not None
    assert await rig.pipeline._answerer.cancel(key)
    async with asyncio.timeout(5):
        while rig.pipeline.rounds.held(token) is not None or len(rig.pipeline.running):
            await asyncio.sleep(0.005)  # polled, bounded: the call has ended
    late = await rig.call({"id": "l3", "continuation": token, "input_responses": answers})
    assert late["error"]["code"] == "cancelled", late


async def test_a_held_call_declined_past_input_timeout_is_bounded_again() -> None:
    """Its deadline stops while the caller thinks; declined past `input_timeout_s`, the
    tool gets a bound again: a tool that then hangs is cancelled, not held forever."""
    rig = Rig(input_timeout_s=0.2)
    async with rig.pipeline:
        asked(await rig.call({"id": "h1", "tool": "stalls", "input": True}))
        async with asyncio.timeout(5):
            while len(rig.pipeline.running):
                await asyncio.sleep(0.01)  # polled, bounded: the run was cancelled


async def test_an_approval_token_continues_nothing_and_stays_unused(rig: Rig) -> None:
    record = TokenRecord(
        token="a.test",
        kind="approval",
        holder=holder_of(None, REPLY),
        owner="w",
        body="{}",
        expires_at=time.time() + 60,
    )
    await rig.pipeline.rounds.tokens.put(record, 60)
    reply = await rig.call({"id": "ap1", "continuation": "a.test", "input_responses": {}})
    assert reply["error"]["code"] == "continuation_invalid"
    kept = await rig.pipeline.rounds.tokens.get("a.test")
    assert kept is not None and kept.state == "open"


async def test_a_copy_of_a_continuation_past_its_tokens_expiry_replays() -> None:
    """A redelivery of the continuation after the token expired still gets that
    continuation's reply (its dedup record), never `expired` for a call that went on."""
    started.clear()
    rig = Rig(input_timeout_s=0.3)
    async with rig.pipeline:
        token = asked(
            await rig.call({"id": "x1", "tool": "which", "arguments": {"room": "x"}, "input": True})
        )
        body = {"id": "x2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
        final = await rig.call(body)
        await asyncio.sleep(0.4)  # past the token's expiry (what is tested is the clock)
        again = await rig.call(body)
    assert final["ok"] is True and again["replayed"] is True
    assert again["result"] == final["result"]


async def test_malformed_answers_are_the_callers_bad_request_and_leave_the_token(
    rig: Rig,
) -> None:
    """Answers that fit no question are refused before the token is taken: the caller
    corrects them and continues; the tool never sees them."""
    token = asked(
        await rig.call({"id": "f1", "tool": "which", "arguments": {"room": "x"}, "input": True})
    )
    wrong: list[dict[str, Any]] = [
        {"elicitation": {"action": "maybe"}},  # not an ElicitResult
        {"elicitation": {"action": "accept", "content": {"choice": {"deep": 1}}}},
        {"sampling": {"role": "assistant"}},  # answers a question nobody asked
    ]
    for n, answers in enumerate(wrong):
        reply = await rig.call({"id": f"f2-{n}", "continuation": token, "input_responses": answers})
        assert reply["error"]["code"] == "bad_request", reply
        details = reply["error"]["details"]
        assert details["reason"] == "bad_input_responses"
        assert details["errors"] and all(
            e["path"].startswith("input_responses/") for e in details["errors"]
        )
    final = await rig.call(
        {"id": "f3", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
    )
    assert final["ok"] is True and final["result"]["structured"]["choice"] == "lamp"
    assert started == ["x"]


async def test_another_callers_malformed_answer_learns_nothing(rig: Rig) -> None:
    """A token of another caller is `unknown`, whatever the answers hold: its shape is
    not checked for a caller it is not for."""
    body = {"id": "o1", "tool": "which", "arguments": {"room": "x"}, "input": True}
    token = asked(await rig.call({**body, "caller": "alice"}))
    thief = {"id": "o2", "caller": "mallory", "continuation": token}
    refused = await rig.call({**thief, "input_responses": {"elicitation": {"action": "?"}}})
    assert refused["error"]["code"] == "continuation_invalid"
    assert refused["error"]["details"]["reason"] == "unknown"


async def test_an_end_too_large_to_keep_is_told_not_kept_not_expired() -> None:
    """A held call that ends (declined past `input_timeout_s`) after its continuation
    took the token but before it resumed: an end too large to keep whole is
    `reply_not_kept` (it ended), never `expired` (which says the question timed out)."""
    rig = Rig(input_timeout_s=0.2)
    async with rig.pipeline:
        token = asked_any(await rig.call({"id": "g1", "tool": "big", "input": True}))
        key = Once.key(None, REPLY, "g2")
        assert key is not None
        tokens = rig.pipeline.rounds.tokens
        taken = await tokens.take(token, holder_of(None, REPLY), key, None)  # the race
        assert taken.record is not None
        async with asyncio.timeout(5):
            while rig.pipeline.rounds.ending(token) is None:
                await asyncio.sleep(0.01)  # polled, bounded: declined, ended unheard
        late = await rig.call(
            {"id": "g2", "continuation": token, "input_responses": {"elicitation": ACCEPT}}
        )
    assert late["error"]["code"] == "reply_not_kept", late
    assert late["error"]["details"]["ended"] is True


class DownTokens(MemoryTokens):
    """A token store that cannot be reached (as a Redis that went away)."""

    async def put(self, record: TokenRecord, valid_s: float) -> None:
        raise ConnectionError("the store is down")


async def test_a_question_the_store_cannot_keep_fails_as_toolbuss_not_as_a_decline() -> None:
    started.clear()
    rig = Rig(tokens=DownTokens("w1"))
    async with rig.pipeline:
        reply = await rig.call(
            {"id": "z1", "tool": "which", "arguments": {"room": "x"}, "input": True}
        )
    assert reply["error"]["code"] == "tool_error", reply
    details = reply["error"]["details"]
    assert details["reason"] == "input_unrelayed" and details["refused"] == "unavailable"


def asked_any(reply: dict[str, Any]) -> str:
    assert reply["error"]["code"] == "input_required", reply
    token: str = reply["error"]["details"]["continuation"]
    return token


async def test_a_cancel_of_a_stateless_call_whose_token_was_taken_cancels_nothing() -> None:
    """The first request's key names the call only while its token is open: once a
    continuation took it (the call resumed under that request's own key), a cancel naming
    the first reports nothing cancelled here, and the continuation keeps its token."""
    rounds = Rounds(MemoryTokens("w1"), input_timeout_s=60.0, running=RunningCalls())
    holder, origin = holder_of("alice", None), f"alice{KEY_SEP}r1"
    question = InputRequest(method="elicitation/create", params={"message": "Which?"})
    asked = InputRequired("asks", questions={"q": question}, state="s")
    refused = await rounds.suspend("t", {}, holder, asked, origin)
    token = refused.details["continuation"]
    open_one = await rounds.suspend("t", {}, holder, asked, f"alice{KEY_SEP}r9")
    taken = await rounds.tokens.take(token, holder, f"alice{KEY_SEP}r2", None)
    assert taken.record is not None
    rounds.taken(origin)
    assert await rounds.cancel(origin) is False
    record = await rounds.tokens.get(token)
    assert record is not None and record.state == "taken"
    # A call whose token is still open is cancelled by its first request's key.
    assert await rounds.cancel(f"alice{KEY_SEP}r9") is True
    ended = await rounds.tokens.get(open_one.details["continuation"])
    assert ended is not None and ended.state == ENDED


async def test_anonymous_clients_share_one_input_max_open_whatever_their_reply_topics() -> None:
    started.clear()
    rig = Rig(input_max_open=2)
    async with rig.pipeline:
        body = {"tool": "which", "arguments": {"room": "x"}, "input": True}
        for n in range(2):
            asked(await rig.call({"id": f"y{n}", **body}, reply_topic=f"tb/reply/made-up-{n}"))
        over = await rig.call({"id": "y2", **body}, reply_topic="tb/reply/made-up-2")
    assert over["error"]["code"] == "tool_error", over
    assert over["error"]["details"]["reason"] == "input_unrelayed"
