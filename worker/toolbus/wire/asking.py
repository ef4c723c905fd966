"""Asking: the options of a call whose tool may ask its caller something (input relayed
from an MCP server: elicitation, sampling), and of a call a person must approve.

`Asking` is part of `contracts.Options` (as `Steering` is): a caller that can answer
says `input: true`; it answers a reply `input_required` with a new request holding
`continuation` and `input_responses`; it re-sends a call answered `approval_required`
with `approval`. `InputRequest` is one question, as MCP defines it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

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
