"""The providers' own objects, built offline by their SDKs, and their parameter types.

What a caller publishes is `model_dump()` of what its SDK returned; what it appends to
its conversation must validate as the SDK's own parameter types.
"""

from __future__ import annotations

from typing import Any

import ollama
from anthropic.types import Message, MessageParam, ToolParam, ToolUseBlock
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import Response, ResponseInputItemParam
from pydantic import TypeAdapter

ANTHROPIC_MESSAGE = TypeAdapter(MessageParam)
ANTHROPIC_TOOL = TypeAdapter(ToolParam)
CHAT_MESSAGE = TypeAdapter(ChatCompletionMessageParam)
CHAT_TOOL_MESSAGE = TypeAdapter(ChatCompletionToolMessageParam)
RESPONSES_ITEM = TypeAdapter(ResponseInputItemParam)
OLLAMA_MESSAGE = TypeAdapter(ollama.Message)


def anthropic_message(*blocks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    message = Message.model_validate(
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
    return {**message.model_dump(), **extra}


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
    completion = ChatCompletion.model_validate(
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
    return completion.model_dump()


def response(*calls: tuple[str, str, str]) -> dict[str, Any]:
    made = Response.model_validate(
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
    return made.model_dump()


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
