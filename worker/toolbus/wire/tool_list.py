"""What a request on `{prefix}/tools` gets: the tool definitions, and what they may lack.

`ToolList` is the `structured` result of our own format; every format's list carries its
`pending` beside the definitions (`toolbus.tools.definitions`).
"""

from __future__ import annotations

from pydantic import Field, JsonValue

from toolbus.wire.model import McpServerState, WireModel


class ToolDefinition(WireModel):
    name: str
    description: str = ""
    input_schema: dict[str, JsonValue] = Field(alias="inputSchema")
    origin: str = Field(description="`local` or `mcp:{server}`.")
    original_name: str | None = Field(
        default=None,
        alias="originalName",
        description="The name the MCP server announced, when it had to be sanitized.",
    )
    title: str | None = Field(default=None, description="MCP: the tool's display name.")
    output_schema: dict[str, JsonValue] | None = Field(
        default=None,
        alias="outputSchema",
        description="MCP: the JSON Schema of the tool's `structured` result (checked).",
    )
    annotations: dict[str, JsonValue] | None = Field(
        default=None,
        description="MCP: the server's hints (`readOnlyHint`, `destructiveHint`, ...), as sent; "
        "hints only, unless the server is `trusted`.",
    )
    execution: dict[str, JsonValue] | None = Field(
        default=None, description="MCP: how the tool runs (`taskSupport`), as the server sent it."
    )


class PendingServer(WireModel):
    """An MCP server whose tools a tool list may lack: not `ready` when it was answered."""

    server: str
    state: McpServerState = Field(
        description="`connecting` (still starting when the request's deadline came: its "
        "tools are not listed yet), `degraded` (its session was lost: its tools are listed, "
        "calls get `unavailable` until it is back), `down` (start-up failed: no tools "
        "listed; retried in the background) or `stopped`."
    )


class ToolList(WireModel):
    """The `structured` result of a request on `{prefix}/tools`."""

    tools: list[ToolDefinition]
    pending: list[PendingServer] = Field(
        default_factory=list,
        description="The MCP servers not ready when the list was made (a list asked during "
        "start-up waits for servers still connecting, within its deadline): empty when the "
        "list is complete. Ask again later for the tools of a `connecting` or `down` server.",
    )
