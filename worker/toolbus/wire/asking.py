"""Asking: the options of a call whose tool may ask its caller something (input relayed
from an MCP server: elicitation, sampling), and of a call a person must approve.

`Asking` is part of `contracts.Options` (as `Steering` is): a caller that can answer
says `input: true`; it answers a reply `input_required` with a new request holding
`continuation` and `input_responses`; it re-sends a call answered `approval_required`
with `approval`. `InputRequest` is one question, as MCP defines it; `ElicitAnswer` and
`SamplingAnswer` are the shapes of the answers MCP defines (`ElicitResult`, the
`CreateMessageResult` of a sampling without tools), checked before a continuation takes
its token (`answer_errors`): a malformed answer is the caller's `bad_request`, and the
token stays unused for a corrected one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from toolbus.wire.model import WireModel as _Wire

MAX_TOKEN_CHARS = 200  # a continuation or approval token: ours are far shorter

ELICITATION = "elicitation/create"
SAMPLING = "sampling/createMessage"
InputMethod = Literal["elicitation/create", "sampling/createMessage"]


class InputRequest(_Wire):
    """One question a tool asks its caller: the MCP request, as MCP defines its params
    (`ElicitRequestParams` in form or URL mode, `CreateMessageRequestParams`)."""

    method: InputMethod
    params: dict[str, JsonValue] = Field(default_factory=dict)


class ElicitAnswer(_Wire):
    """An answer to an elicitation (MCP `ElicitResult`)."""

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, str | int | float | bool | list[str] | None] | None = None


class SamplingContent(_Wire):
    """One content block of a sampling answer (text, image, audio: MCP's own)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str


class SamplingAnswer(_Wire):
    """An answer to a sampling request (MCP `CreateMessageResult`)."""

    role: Literal["user", "assistant"]
    content: SamplingContent | list[SamplingContent]
    model: str


ANSWERS: dict[str, type[BaseModel]] = {ELICITATION: ElicitAnswer, SAMPLING: SamplingAnswer}


def answer_errors(asked: dict[str, str], answers: dict[str, Any]) -> list[dict[str, Any]]:
    """What is wrong with `answers` to the questions `asked` (key -> method): an answer
    to no question asked, or one not of its question's shape (`path`, `problem`; never
    the value). A question left unanswered is no error: it is declined."""
    errors: list[dict[str, Any]] = []
    for key, answer in answers.items():
        method = asked.get(key)
        if method is None:
            errors.append({"path": f"input_responses/{key}", "problem": "not_asked"})
            continue
        try:
            ANSWERS[method].model_validate(answer)
        except ValidationError as bad:
            for error in bad.errors()[:8]:
                where = "/".join(str(part) for part in error["loc"])
                errors.append({"path": f"input_responses/{key}/{where}", "problem": error["type"]})
    return errors


class Asking(_Wire):
    """The options of a call that may ask its caller, or that a person approved (part of
    `Options`)."""

    input: bool | None = Field(
        default=None,
        description="The caller can answer what a tool asks (elicitation, sampling): such a "
        "call's reply may be `input_required` (MQTT v5: or the user property "
        "`toolbus-input: 1`). Without it a tool's questions are declined for the caller.",
    )
    continuation: str | None = Field(
        default=None,
        max_length=MAX_TOKEN_CHARS,
        description="Continue the call an `input_required` reply named "
        "(`error.details.continuation`), with `input_responses`; the request needs no "
        "tool and takes its own id. Single-use, bound to its caller, expires.",
    )
    input_responses: dict[str, dict[str, JsonValue]] | None = Field(
        default=None,
        description="With `continuation`: the answer to each of `error.details."
        "input_requests` by its key: `{action, content}` for elicitation, a "
        "`CreateMessageResult` for sampling.",
    )
    approval: str | None = Field(
        default=None,
        max_length=MAX_TOKEN_CHARS,
        description="The token of an `approval_required` reply "
        "(`error.details.approval`): the same call again, approved; it runs once.",
    )
