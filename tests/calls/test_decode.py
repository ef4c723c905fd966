"""Decode: every accepted request shape, and every way a message is refused."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from toolbus.calls.call import Call
from toolbus.doors.envelope.decode import Calls, Rejected, decode
from toolbus.wire.contracts import ErrorCode, ReplyFormat
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import Topics

TOPICS = Topics("tb", "grp", ("tb/reply/",))
LIMIT = 4096


def inbound(body: Any, topic: str = "tb/call", **kw: Any) -> Inbound:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Inbound(topic=topic, payload=payload, **kw)


def ok(message: Inbound) -> Call:
    result = decode(message, TOPICS, LIMIT)
    assert isinstance(result, Call), result
    return result


def many(message: Inbound) -> Calls:
    result = decode(message, TOPICS, LIMIT)
    assert isinstance(result, Calls), result
    return result


def refused(message: Inbound) -> Rejected:
    result = decode(message, TOPICS, LIMIT)
    assert isinstance(result, Rejected), result
    return result


def test_envelope_with_tool_in_body() -> None:
    call = ok(
        inbound(
            {
                "id": "1",
                "tool": "echo",
                "arguments": {"text": "x"},
                "reply_to": "tb/reply/a",
                "timeout_s": 2,
            }
        )
    )
    assert (call.id, call.tool, call.arguments, call.timeout_s) == ("1", "echo", {"text": "x"}, 2)
    assert call.reply is not None and call.reply.topic == "tb/reply/a"
    assert call.id_generated is False


def test_tool_from_topic_and_generated_id() -> None:
    call = ok(inbound({"arguments": {}}, topic="tb/call/datetime"))
    assert call.tool == "datetime"
    assert call.id_generated is True and len(call.id) == 36


def test_v5_response_topic_beats_body_reply_to() -> None:
    call = ok(
        inbound(
            {"tool": "echo", "reply_to": "tb/reply/body"},
            response_topic="tb/reply/v5",
            correlation_data=b"c",
        )
    )
    assert call.reply is not None
    assert (call.reply.topic, call.reply.correlation_data) == ("tb/reply/v5", b"c")


def test_anthropic_tool_use() -> None:
    calls = many(
        inbound({"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "hi"}})
    )
    [call] = calls.calls
    assert (call.id, call.tool, call.arguments) == ("toolu_1", "echo", {"text": "hi"})
    assert calls.format is ReplyFormat.ANTHROPIC and calls.id == "toolu_1"  # a lone call's id


def test_openai_tool_call_with_string_arguments() -> None:
    [call] = many(
        inbound(
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "echo", "arguments": '{"text": "hi"}'},
            }
        )
    ).calls
    assert (call.id, call.tool, call.arguments) == ("call_1", "echo", {"text": "hi"})


def test_ollama_message_with_one_tool_call() -> None:
    body = {
        "toolbus": {"reply_to": "tb/reply/x"},
        "tool_calls": [{"function": {"name": "echo", "arguments": {"text": "hi"}}}],
    }
    calls = many(inbound(body))
    [call] = calls.calls
    assert (call.tool, call.arguments, call.id_generated) == ("echo", {"text": "hi"}, True)
    assert calls.reply is not None and calls.reply.topic == "tb/reply/x"
    assert calls.format is ReplyFormat.OLLAMA


def test_tools_listing_topic() -> None:
    assert ok(inbound({}, topic="tb/tools")).list_tools


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"\xff\xfe\x00",
        b"[1, 2]",
        b'"a string"',
        b"{}",
        b'{"tool": ""}',
        b'{"tool": "echo", "arguments": [1]}',
        b'{"tool": "echo", "timeout_s": -1}',
        b'{"tool_calls": []}',
        b'{"tool_calls": [{"function": {"name": "a"}, "id": 1}]}',
        b'{"tool_calls": [{"function": {"name": "a"}, "id": "x"}, {"function": {}, "id": "x"}]}',
        b'{"type": "tool_use", "name": "echo", "toolbus": {"timeout_s": "soon"}}',
        b'{"tool": "echo", "timeout_s": 1, "toolbus": {"timeout_s": 2}}',
        b'{"tool": "echo", "level": 3}',
        b'{"tool": "echo", "reply_format": "smoke-signals"}',
        b'{"type": "message", "content": [{"type": "text", "text": "no tools"}]}',
        b"{" + b" " * LIMIT + b"}",
        b"[" * 3000,
        b'{"tool": "echo", "arguments": {"a": ' + b"[" * 1500 + b"]" * 1500 + b"}}",
        b'{"tool": "echo", "timeout_s": NaN}',
        b'{"tool": "echo", "timeout_s": Infinity}',
        b'{"tool": "echo", "id": 7}',
    ],
)
def test_bad_requests(payload: bytes) -> None:
    rejected = refused(inbound(payload, response_topic="tb/reply/r"))
    assert rejected.error.code is ErrorCode.BAD_REQUEST
    assert rejected.reply is not None  # the v5 address survives a bad body


def test_topic_and_body_disagree() -> None:
    assert refused(inbound({"tool": "b"}, topic="tb/call/a")).error.code is ErrorCode.BAD_REQUEST


def test_rejected_keeps_the_body_id() -> None:
    rejected = refused(inbound({"id": "keep-me", "reply_to": "tb/reply/x"}))
    assert (rejected.id, rejected.id_generated) == ("keep-me", False)
    assert rejected.reply is not None


@pytest.mark.parametrize(
    "reply_topic",
    [
        "elsewhere/lights/set",
        "tb/reply/+",
        "tb/reply/#",
        "$SYS/broker",
        "tb/replyx",
        "tb/reply/" + "x" * 2000,
    ],
)
def test_reply_topics_outside_the_prefix_are_forbidden(reply_topic: str) -> None:
    _assert_forbidden(reply_topic, TOPICS)


@pytest.mark.parametrize("reply_topic", ["tb/call", "tb/call/echo", "tb/tools"])
def test_replies_never_go_to_request_topics_even_if_allowed(reply_topic: str) -> None:
    _assert_forbidden(reply_topic, Topics("tb", "grp", ("tb/",)))


def _assert_forbidden(reply_topic: str, topics: Topics) -> None:
    for message in (
        inbound({"tool": "echo"}, response_topic=reply_topic),
        inbound({"tool": "echo", "reply_to": reply_topic}),
    ):
        rejected = decode(message, topics, LIMIT)
        assert isinstance(rejected, Rejected)
        assert rejected.error.code is ErrorCode.FORBIDDEN
        assert rejected.reply is None  # never answered there


def test_refusals_echo_bounded_details() -> None:
    deep = b'{"tool": "echo", "arguments": {"a": ' + b"[" * 400 + b"]" * 400 + b"}}"
    rejected = refused(inbound(deep, response_topic="tb/reply/r"))
    assert rejected.error.code is ErrorCode.BAD_REQUEST
    assert all(len(e["path"]) <= 200 for e in rejected.error.details["errors"])


@pytest.mark.parametrize(
    "body",
    [
        {"tool": "echo", "arguments": {"text": "x"}, "function": {"name": "other"}},
        {"tool": "echo", "arguments": {}, "type": "function_call", "name": "other"},
        {"tool": "echo", "arguments": {}, "output": [], "choices": []},
    ],
)
def test_an_envelope_naming_its_tool_is_never_read_as_a_provider_shape(body: Any) -> None:
    assert ok(inbound(body)).tool == "echo"


def test_a_refused_shape_still_answers_a_311_caller() -> None:
    body = {"role": "assistant", "content": "done", "toolbus": {"reply_to": "tb/reply/a"}}
    rejected = refused(inbound(body))
    assert rejected.error.details["reason"] == "no_tool_calls"
    assert rejected.reply is not None and rejected.reply.topic == "tb/reply/a"


def test_calls_without_ids_take_the_callers_request_id() -> None:
    body = {
        "message": {"role": "assistant", "tool_calls": [{"function": {"name": "echo"}}] * 2},
        "toolbus": {"id": "req-7"},
    }
    calls = many(inbound(body))
    assert [c.id for c in calls.calls] == ["req-7:0", "req-7:1"]
    assert not any(c.id_generated for c in calls.calls)
    assert (calls.id, calls.format) == ("req-7", ReplyFormat.OLLAMA)


def test_an_ollama_response_stays_ollama_when_its_calls_carry_ids() -> None:
    call = {"id": "c1", "function": {"name": "echo", "arguments": {}}}
    body = {"model": "m", "done": True, "message": {"role": "assistant", "tool_calls": [call]}}
    assert many(inbound(body)).format is ReplyFormat.OLLAMA


def test_a_request_without_an_id_gets_a_fresh_version_4_uuid() -> None:
    topics = Topics("tb", "", ("tb/reply/",))
    message = Inbound(topic="tb/call/echo", payload=b"{}", response_topic="tb/reply/r")
    seen = set()
    for _ in range(2000):
        call = decode(message, topics, 1 << 20)
        assert isinstance(call, Call) and call.id_generated
        parsed = uuid.UUID(call.id)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, call.id)
        seen.add(call.id)
    assert len(seen) == 2000
