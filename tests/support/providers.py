"""The providers' own objects, built offline by their SDKs, and their types as judges of
what we append to a conversation.

What a caller publishes is `model_dump()` of what its SDK returned (the builders below).

Each check validates an item with the SDK's parameter type (pydantic `TypeAdapter` over
the TypedDicts, `ollama.Message` for Ollama), offline. Two leniencies of those adapters
are closed here, so a check that passes means the SDK would send exactly our item:

- `Iterable[...]` fields (an Anthropic `tool_result`'s `content`, a user message's parts)
  come back as lazy `ValidatorIterator`s, judged only when iterated: `materialized`
  iterates them all;
- TypedDicts drop keys they do not know (`is_eror` passes as nothing): the validated
  value must equal the item, so a misspelled or foreign key fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
from anthropic.types import Message, MessageParam, ToolUseBlock
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.responses import Response, ResponseInputItemParam
from pydantic import TypeAdapter

from toolbus.wire.contracts import ReplyFormat

ANTHROPIC_MESSAGE: TypeAdapter[Any] = TypeAdapter(MessageParam)
CHAT_MESSAGE: TypeAdapter[Any] = TypeAdapter(ChatCompletionMessageParam)
RESPONSES_INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)


def materialized(value: Any) -> Any:
    """`value` with every lazy iterator consumed (and so validated) into a list."""
    if isinstance(value, dict):
        return {key: materialized(item) for key, item in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [materialized(item) for item in value]
    return value


def strictly(adapter: TypeAdapter[Any], item: dict[str, Any]) -> None:
    """Raises unless `adapter` accepts `item` whole: every part judged, no key dropped."""
    validated = materialized(adapter.validate_python(item))
    assert validated == item, f"the SDK type keeps only {validated!r} of {item!r}"


def ollama_message(item: dict[str, Any]) -> None:
    """Raises unless `ollama.Message` takes `item` as the client does (base64 strings in
    `images` become `ollama.Image`s) and sends back exactly it."""
    given = dict(item)
    if "images" in given:
        given["images"] = [ollama.Image(value=image) for image in given["images"]]
    message = ollama.Message.model_validate(given)
    assert message.model_dump(exclude_none=True) == item


def check(format: ReplyFormat, item: dict[str, Any]) -> None:
    """One appended item judged by its provider's SDK."""
    if format == ReplyFormat.ANTHROPIC:
        strictly(ANTHROPIC_MESSAGE, item)
    elif format == ReplyFormat.OPENAI:
        strictly(CHAT_MESSAGE, item)
    elif format == ReplyFormat.OPENAI_RESPONSES:
        strictly(RESPONSES_INPUT_ITEM, item)
    elif format == ReplyFormat.OLLAMA:
        ollama_message(item)
    else:
        raise AssertionError(f"nothing to append in {format}")


def anthropic_message(*blocks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An assistant `Message` holding `blocks` after a text block, as published."""
    return {**anthropic_message_model(*blocks).model_dump(), **extra}


def anthropic_message_model(*blocks: dict[str, Any]) -> Message:
    return Message.model_validate(
        {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": "Let me check."}, *blocks],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 20},
        }
    )


def tool_use(ident: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A `tool_use` block as the API sends it now: with a `caller` that is not ours."""
    block = ToolUseBlock.model_validate(
        {
            "type": "tool_use",
            "id": ident,
            "name": name,
            "input": arguments,
            "caller": {"type": "direct"},
        }
    )
    return block.model_dump()


def chat_completion(*calls: tuple[str, str, str]) -> dict[str, Any]:
    """A `ChatCompletion` whose first choice calls `(id, name, arguments JSON)`s."""
    return chat_completion_model(*calls).model_dump()


def chat_completion_model(*calls: tuple[str, str, str]) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-test",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                            for i, n, a in calls
                        ],
                    },
                }
            ],
        }
    )


def response(*calls: tuple[str, str, str]) -> dict[str, Any]:
    """A `Response` whose output holds a reasoning item and the `function_call`s."""
    return response_model(*calls).model_dump()


def response_model(*calls: tuple[str, str, str]) -> Response:
    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "model": "gpt-test",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                *(
                    {"type": "function_call", "call_id": c, "name": n, "arguments": a}
                    for c, n, a in calls
                ),
            ],
        }
    )


def ollama_response(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    made = ollama.ChatResponse.model_validate(
        {
            "model": "llama-test",
            "created_at": "2026-11-23T10:00:00Z",
            "done": True,
            "message": {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": n, "arguments": a}} for n, a in calls],
            },
        }
    )
    return made.model_dump()
