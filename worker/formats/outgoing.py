"""Outgoing (interim, replaced by the full module): replies into provider messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from toolbus.contracts import Reply, ReplyFormat


@dataclass(frozen=True, slots=True)
class Answered:
    call_id: str
    name: str
    reply: Reply


def conversation(format: ReplyFormat, answered: Sequence[Answered]) -> list[dict[str, JsonValue]]:
    if format is ReplyFormat.TOOLBUS:
        return []
    if format is ReplyFormat.ANTHROPIC:
        return [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": a.call_id,
                        "content": a.reply.result.text
                        if a.reply.result
                        else str(a.reply.error.code if a.reply.error else ""),
                        "is_error": not a.reply.ok,
                    }
                    for a in answered
                ],
            }
        ]
    if format is ReplyFormat.OPENAI_RESPONSES:
        return [
            {
                "type": "function_call_output",
                "call_id": a.call_id,
                "output": a.reply.result.text if a.reply.result else "error",
            }
            for a in answered
        ]
    return [
        {
            "role": "tool",
            "tool_call_id": a.call_id,
            "content": a.reply.result.text if a.reply.result else "error",
        }
        for a in answered
    ]
