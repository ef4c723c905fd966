"""MCP server settings: one `mcpServers` entry (the shape MCP clients use), and `[mcp]`."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from toolbus.wire.broker import BrokerUrl as BrokerUrl  # noqa: PLC0414 -- re-exported: its former home


class McpServerConfig(BaseModel):
    """One entry of `mcpServers`: `command`/`args`/`env` (stdio) or `url` (streamable HTTP)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    type: Literal["stdio", "http", "streamable-http", "streamable_http"] | None = None
    disabled: bool = False
    connect_timeout_s: float = Field(default=20.0, gt=0)
    trusted: bool = Field(
        default=False,
        description="Its tools' annotations are believed (`destructiveHint` false lets an "
        "approval gate pass); an untrusted server's are hints only (the MCP spec).",
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, description="Default: [mcp].max_in_flight."
    )
    max_result_bytes: int | None = Field(
        default=None, ge=1, description="Default: [mcp].max_result_bytes."
    )

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of `command` (stdio) or `url` (HTTP)")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


class McpPolicy(BaseModel):
    """How MCP sessions are started, recovered and loaded, under `[mcp]` (all servers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    startup_attempts: int = Field(default=3, ge=1)
    startup_base_delay_s: float = Field(
        default=2.0, ge=0, description="Delay before the 2nd attempt; it doubles after each."
    )
    recovery_max_delay_s: float = Field(
        default=60.0, gt=0, description="Cap of the jittered backoff once start-up has failed."
    )
    health_interval_s: float = Field(
        default=15.0, gt=0, description="How often an HTTP session is pinged to notice loss."
    )
    max_in_flight: int = Field(default=32, ge=1, description="Calls in flight per server.")
    max_result_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1,
        description="The largest tool result taken from a server (its JSON); a larger one "
        "is `tool_error` with `details.limit_bytes`, and the session goes on.",
    )
