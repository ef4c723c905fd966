"""Progress: one update of a running call, on its caller's reply topic before the reply;
and `Steering`, the request options that steer a call while it runs (progress, a
deadline progress extends, a task), which `contracts.Options` inherits.

Its own module (re-exported from `contracts`, whose schemas list includes it), as the
tool list's models are.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from toolbus.wire.model import WireModel as _Wire


class Progress(_Wire):
    """One progress update of a running call, on the caller's reply topic (with the
    request's correlation data), before its reply. The reply is the one message with `ok`."""

    type: Literal["progress"] = "progress"
    id: str = Field(description="The call's id (each call's own, in a message of many).")
    progress: float = Field(description="How far the call has got; it only increases.")
    total: float | None = Field(default=None, description="Where `progress` will end, if known.")
    message: str | None = Field(default=None, description="What the tool says it is doing.")


class Steering(_Wire):
    """The options that steer a call while it runs (part of `Options`)."""

    progress: bool | None = Field(
        default=None,
        description="Send this call's progress updates (`Progress` messages) to the reply "
        "topic before its reply (MQTT v5: or the user property `toolbus-progress: 1`).",
    )
    extend_on_progress: bool | None = Field(
        default=None,
        description="Each progress update restarts the call's deadline, never past the "
        "tool's `max_timeout_s` (nor the message's expiry).",
    )
    task: bool | None = Field(
        default=None,
        description="Run the call as a task: a first reply (`task_id`, `status: working`) at "
        "once, the final reply (`ok`, `task_id`, `status`) pushed when it ends.",
    )
