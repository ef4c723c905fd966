"""Example payloads of the requests, as the document shows them.

The tests check that each is valid against its message's payload and that the worker
reads it as that message says (`formats.incoming.read`).
"""

from __future__ import annotations

from typing import Any

from toolbus.wire.contracts import ReplyFormat, ToolsFormat

Examples = list[tuple[str, Any]]  # (name, payload)

ENVELOPE: Examples = [
    (
        "call",
        {
            "tool": "echo",
            "arguments": {"text": "hi"},
            "id": "req-1",
            "reply_to": "toolbus/reply/me",
        },
    ),
    ("toolNamedByTopic", {"arguments": {"text": "hi"}, "timeout_s": 5}),
    (
        "aCallerThatCanAnswer",
        {"tool": "pick_device", "arguments": {"room": "hall"}, "id": "q1", "input": True},
    ),
    (
        "continuation",
        {
            "id": "q2",
            "continuation": "c.7Dq2vXoZ1m0rJcQnE9bG3sYhKpLw4tUa",
            "input_responses": {
                "elicitation-1": {"action": "accept", "content": {"device": "lamp"}}
            },
            "input": True,
        },
    ),
    (
        "approved",
        {
            "tool": "delete_file",
            "arguments": {"path": "reports/old.csv"},
            "id": "d2",
            "approval": "a.Zk3nQ8cWm1pVx7eRt2bYs9uHj4LfGdAo",
        },
    ),
]
TOOLS_REQUEST: Examples = [("ours", {}), ("forOpenAI", {"format": ToolsFormat.OPENAI.value})]

_ARGS = '{"text": "hi"}'
PROVIDERS: dict[ReplyFormat, Examples] = {
    ReplyFormat.ANTHROPIC: [
        (
            "toolUse",
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "echo",
                "input": {"text": "hi"},
                "toolbus": {"reply_to": "toolbus/reply/me"},
            },
        ),
        (
            "message",
            {
                "id": "msg_01",
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Echoing."},
                    {"type": "tool_use", "id": "toolu_01", "name": "echo", "input": {"text": "hi"}},
                ],
            },
        ),
    ],
    ReplyFormat.OPENAI: [
        (
            "chatCompletion",
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "echo", "arguments": _ARGS},
                                }
                            ],
                        },
                    }
                ],
            },
        ),
        (
            "toolCall",
            {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": _ARGS}},
        ),
    ],
    ReplyFormat.OPENAI_RESPONSES: [
        (
            "functionCall",
            {"type": "function_call", "call_id": "call_1", "name": "echo", "arguments": _ARGS},
        ),
        (
            "output",
            [{"type": "function_call", "call_id": "call_1", "name": "echo", "arguments": _ARGS}],
        ),
    ],
    ReplyFormat.OLLAMA: [
        (
            "chatResponse",
            {
                "model": "llama3.2",
                "message": {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "echo", "arguments": {"text": "hi"}}}],
                },
                "toolbus": {"id": "req-1"},
            },
        ),
    ],
}
