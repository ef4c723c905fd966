"""The base of every wire model, and the MCP server states and the `trace_unavailable`
reasons several of them carry."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

McpServerState = Literal["connecting", "ready", "degraded", "down", "stopped"]

TraceUnavailable = Literal["not_recording", "not_sampled"]
"""Why a request that asked for its spans gets none (`Reply.trace_unavailable`)."""

# A reply's and a many-call reply's `trace_unavailable`, described once.
TRACE_UNAVAILABLE = (
    "Set when the request asked for its spans (`publish_trace`) and none will follow on "
    "`{reply_topic}/trace`: `not_recording` (the worker records no spans: no exporter and "
    "`publish_traces` off) or `not_sampled` (the trace was sampled out)."
)


class WireModel(BaseModel):
    """Unknown fields ignored (a newer peer may add some), names or aliases, immutable."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
