"""Progress: one update of a running call, on its caller's reply topic before the reply.

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
