"""Callers: the `[callers.NAME]` profile, and the one rule for finding a caller's.

A profile names the tools a caller may use and its quotas. `[callers."*"]` applies to
callers without their own and fills in what a caller's own profile leaves unset; a
request that names no caller is `anonymous`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from toolbus.wire.topics import ANONYMOUS_CALLER as ANONYMOUS_CALLER  # noqa: PLC0414 -- re-exported: its former home


class CallerProfile(BaseModel):
    """`[callers.NAME]`: the tools a caller may use (by any name that resolves) and its quotas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tools: list[str] | None = Field(default=None, description="Unset: every tool.")
    max_in_flight: int | None = Field(
        default=None, ge=1, description="Calls this caller may have running at once."
    )
    rate_per_s: float | None = Field(
        default=None, gt=0, description="Calls per second this caller may start, on average."
    )
    approve: list[str] | None = Field(
        default=None,
        description="Calls a person must approve first: `destructive` (a tool whose "
        "annotations say so, or that has none, or whose server is not `trusted`) and tool "
        "names. Unset: none.",
    )
    burst: int | None = Field(
        default=None, ge=1, description="Calls it may start at once; default: rate_per_s, >= 1."
    )

    @property
    def limited(self) -> bool:
        return self.max_in_flight is not None or self.rate_per_s is not None


NO_CALLER_PROFILE = CallerProfile()
DEFAULT_CALLER_PROFILE = "*"


def caller_profile(profiles: Mapping[str, CallerProfile], caller: str | None) -> CallerProfile:
    """A caller's `[callers.NAME]`, what it leaves unset taken from `[callers."*"]`.

    The one lookup rule for callers: a request naming no caller is `anonymous`.
    """
    own = profiles.get(caller or ANONYMOUS_CALLER)
    default = profiles.get(DEFAULT_CALLER_PROFILE, NO_CALLER_PROFILE)
    if own is None:
        return default
    return default.model_copy(update=own.model_dump(exclude_none=True))
