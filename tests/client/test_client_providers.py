"""`Client.run_tool_calls`: a model's message as its SDK made it, through a real broker
and worker; back comes what to append to the conversation.

The messages are SDK objects built offline (`model_validate`, no network) and handed to
the client as they are; every `append` item is checked with the SDK's own parameter type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from anthropic.types import Message, MessageParam
from openai.types.chat import ChatCompletionToolMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.providers import anthropic_message_model, tool_use
from tests.support.providers import chat_completion_model as chat_completion
from tests.support.providers import response_model as response
from toolbus import Client, ErrorCode, ReplyFormat
from toolbus.wire.errors import BadRequest

ANTHROPIC_MESSAGE = TypeAdapter(MessageParam)
CHAT_TOOL_MESSAGE = TypeAdapter(ChatCompletionToolMessageParam)
RESPONSES_ITEM = TypeAdapter(ResponseInputItemParam)


@pytest_asyncio.fixture
async def client(broker: Broker) -> AsyncIterator[Client]:
    settings = make_settings(broker)
    async with running_worker(settings), Client(broker.url, prefix=settings.topic_prefix) as c:
        yield c


def anthropic_message(*uses: tuple[str, str, dict[str, Any]]) -> Message:
    return anthropic_message_model(*(tool_use(i, n, a) for i, n, a in uses))


async def test_an_anthropic_message_gives_the_user_turn_to_append(client: Client) -> None:
    message = anthropic_message(
        ("toolu_1", "echo", {"text": "one"}),
        ("toolu_2", "ecko", {"text": "two"}),  # no such tool: that call's error only
        ("toolu_3", "echo", {}),  # no `text`: invalid_arguments
    )
    answer = await client.run_tool_calls_reply(message)
    [turn] = await client.run_tool_calls(message)  # the short form: the same `append`
    assert answer.append == [turn]
    ANTHROPIC_MESSAGE.validate_python(turn)
    assert turn["role"] == "user"
    blocks = turn["content"]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_1", "toolu_2", "toolu_3"]
    assert [b.get("is_error", False) for b in blocks] == [False, True, True]
    assert (answer.id, answer.format, answer.ok) == ("msg_01", ReplyFormat.ANTHROPIC, False)
    assert [r.error.code if r.error else None for r in answer.results] == [
        None,
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.INVALID_ARGUMENTS,
    ]
    # The content list alone, or in the assistant turn an integrator keeps, runs the same calls.
    assert await client.run_tool_calls(message.content) == [turn]
    assert await client.run_tool_calls({"role": "assistant", "content": message.content}) == [turn]


@pytest.mark.parametrize("count", [1, 2, 5])
async def test_a_chat_completion_gives_one_tool_message_per_call(
    client: Client, count: int
) -> None:
    calls = [(f"call_{n}", "echo", f'{{"text": "t{n}"}}') for n in range(count)]
    completion = chat_completion(*calls)
    appended = await client.run_tool_calls(completion)
    for item in appended:
        CHAT_TOOL_MESSAGE.validate_python(item)
    assert [m["tool_call_id"] for m in appended] == [c[0] for c in calls]
    assert [m["role"] for m in appended] == ["tool"] * count
    assert [f"t{n}" in m["content"] for n, m in enumerate(appended)] == [True] * count
    # The assistant message alone, and one tool call alone, run too.
    assert await client.run_tool_calls(completion.choices[0].message) == appended
    tool_calls = completion.choices[0].message.tool_calls
    assert tool_calls is not None
    assert await client.run_tool_calls(tool_calls[0]) == appended[:1]


async def test_a_responses_output_gives_function_call_outputs(client: Client) -> None:
    made = response(("call_a", "echo", '{"text": "a"}'), ("call_b", "echo", '{"text": "b"}'))
    appended = await client.run_tool_calls(made)
    for item in appended:
        RESPONSES_ITEM.validate_python(item)
    assert [(i["type"], i["call_id"]) for i in appended] == [
        ("function_call_output", "call_a"),
        ("function_call_output", "call_b"),
    ]
    assert await client.run_tool_calls(made.output) == appended  # the bare output list


async def test_reply_format_asks_for_another_shape(client: Client) -> None:
    message = anthropic_message(("toolu_9", "echo", {"text": "x"}))
    as_chat = await client.run_tool_calls(message, reply_format="openai")
    assert [(m["role"], m["tool_call_id"]) for m in as_chat] == [("tool", "toolu_9")]
    ours = await client.run_tool_calls_reply(message, reply_format=ReplyFormat.TOOLBUS)
    assert ours.append == [] and ours.format == ReplyFormat.TOOLBUS
    assert [r.id for r in ours.results] == ["toolu_9"]
    assert ours.results[0].result is not None
    assert ours.results[0].result.structured == {"text": "x", "data": None}


async def test_a_message_with_no_tool_calls_is_refused_whole(client: Client) -> None:
    text_only = [{"type": "text", "text": "Nothing to run."}]
    with pytest.raises(BadRequest) as refused:
        await client.run_tool_calls(text_only)
    assert refused.value.code == ErrorCode.BAD_REQUEST
    assert refused.value.details.get("reason") == "no_tool_calls"


async def test_a_named_caller_in_topic_mode_runs_its_calls(broker: Broker) -> None:
    settings = make_settings(
        broker, caller_identity="topic", callers={"kitchen": {"tools": ["echo"]}}
    )
    async with (
        running_worker(settings),
        Client(
            broker.url, prefix=settings.topic_prefix, caller="kitchen", caller_identity="topic"
        ) as client,
    ):
        answer = await client.run_tool_calls_reply(
            anthropic_message(("toolu_k1", "echo", {"text": "k"}), ("toolu_k2", "datetime", {}))
        )
    assert [r.error.code if r.error else None for r in answer.results] == [
        None,
        ErrorCode.FORBIDDEN,  # the caller's set holds `echo` only: the topic named it
    ]
