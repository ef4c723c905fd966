"""The base of every wire model, and the MCP server states several of them carry."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

McpServerState = Literal["connecting", "ready", "degraded", "down", "stopped"]


class WireModel(BaseModel):
    """Unknown fields ignored (a newer peer may add some), names or aliases, immutable."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
