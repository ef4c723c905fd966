"""The answers a continuation carries are checked before its token is taken
(`wire.asking.answer_errors`); what the check accepts and refuses is what the mcp SDK's
own types (`ElicitResult`, `CreateMessageResult`) accept and refuse."""

from __future__ import annotations

from typing import Any

import pytest
from mcp_types import CreateMessageResult, ElicitResult
from pydantic import BaseModel, ValidationError

from toolbus.wire.asking import ELICITATION, SAMPLING, answer_errors

TEXT = {"type": "text", "text": "a summary"}
CASES: list[tuple[str, dict[str, Any]]] = [
    (ELICITATION, {"action": "accept", "content": {"name": "Ada", "n": 3, "tags": ["a"]}}),
    (ELICITATION, {"action": "decline"}),
    (ELICITATION, {"action": "cancel", "content": None}),
    (ELICITATION, {"action": "accept", "content": {"deep": {"x": 1}}}),
    (ELICITATION, {"action": "maybe"}),
    (ELICITATION, {"content": {"name": "Ada"}}),
    (ELICITATION, {"action": "accept", "content": ["not", "an", "object"]}),
    (SAMPLING, {"role": "assistant", "content": TEXT, "model": "m", "stopReason": "endTurn"}),
    (
        SAMPLING,
        {
            "role": "assistant",
            "content": {"type": "image", "data": "AA==", "mimeType": "image/png"},
            "model": "m",
        },
    ),
    (SAMPLING, {"role": "assistant", "content": TEXT}),
    (SAMPLING, {"role": "robot", "content": TEXT, "model": "m"}),
    (SAMPLING, {"role": "assistant", "content": "just text", "model": "m"}),
    (SAMPLING, {"action": "accept"}),
]
SDK: dict[str, type[BaseModel]] = {ELICITATION: ElicitResult, SAMPLING: CreateMessageResult}


def sdk_accepts(method: str, answer: dict[str, Any]) -> bool:
    try:
        SDK[method].model_validate(answer)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("method", "answer"), CASES)
def test_the_check_agrees_with_the_sdks_types(method: str, answer: dict[str, Any]) -> None:
    errors = answer_errors({"q": method}, {"q": answer})
    assert (not errors) == sdk_accepts(method, answer), errors
    assert all(e["path"].startswith("input_responses/q") for e in errors)


def test_an_answer_to_a_question_not_asked_is_an_error_and_an_unanswered_one_is_not() -> None:
    asked = {"a": ELICITATION, "b": ELICITATION}
    assert answer_errors(asked, {"a": {"action": "decline"}}) == []
    [error] = answer_errors(asked, {"c": {"action": "decline"}})
    assert error == {"path": "input_responses/c", "problem": "not_asked"}
