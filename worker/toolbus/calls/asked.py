"""Asked: what a round that ends in questions answers, and what toolbus says when it
cannot put a tool's question to its caller at all.

The round's answer is `input_required`, with the questions and the continuation token
that answers them (docs/error-codes.md). A question toolbus itself cannot relay (the
caller's `input_max_open` reached, the token store down) is an error to the tool that
asked (`tool_error`, reason `input_unrelayed`, `refused` the code that stopped it), never
a `decline` in the caller's name: a decline is the person's answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolbus.wire.asking import InputRequest
from toolbus.wire.errors import InputRequired, ToolbusError, ToolFailed


@dataclass(frozen=True, slots=True)
class Asked:
    """A round that ends in questions: what the caller is asked, and the token that
    answers them."""

    questions: dict[str, InputRequest]
    token: str
    expires_in_s: float

    def error(self) -> InputRequired:
        return asked_error(self.questions, self.token, self.expires_in_s)


def asked_error(
    questions: dict[str, InputRequest], token: str, expires_in_s: float
) -> InputRequired:
    """The round's answer: `input_required`, with the questions and the token."""
    return InputRequired(
        "the tool asks its caller before it goes on: answer with `continuation`",
        input_requests={k: q.model_dump(mode="json", by_alias=True) for k, q in questions.items()},
        continuation=token,
        expires_in_s=expires_in_s,
    )


def unrelayed(refused: ToolbusError) -> ToolFailed:
    """toolbus could not put a tool's question to its caller (`refused` says why)."""
    return ToolFailed(
        "toolbus could not put the question to the caller",
        reason="input_unrelayed",
        refused=refused.code.value,
    )
