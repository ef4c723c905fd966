"""An MCP test server (the SDK's MCPServer, over stdio) of either protocol era; run it as
`python -m tests.support.servers.eras` from the repository's root.

By default it speaks what the client opens with: 2026-07-28 to a client that asks
`server/discover`, 2025-11-25 to one that opens with `initialize` (the SDK's servers serve
both). With `TB_ERA=legacy` it is a server of 2025-11-25 only (`legacy_only`): it answers
`server/discover` as such a server does, "method not found", so a client falls back to
`initialize`.

Tools, as a server lists them (`outputSchema`, `annotations`, `execution`) and answers
them (`structuredContent` of any JSON value, resource links, embedded resources), with no
SDK layer between: `list_tools` and `call_tool` are this server's own.

  numbers    structured content that is an array (2026-07-28 allows any JSON value; not
             listed by a legacy server, whose era allows objects only)
  count      `{"n": n}` against an outputSchema that wants an integer: `n` of another
             type is an output-schema violation; annotated read-only, `execution` listed
  unshaped   says it has an outputSchema but returns no structured content
  links      a `resource_link` and two embedded resources (text and blob)
  meta       answers the request's `_meta` as it arrived (what the client stamped)
  grow       adds the tool `grown` and says so only to `subscriptions/listen` streams
             (the 2026-07-28 way: a handshake-era session never hears it)
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
    ToolExecution,
)

from tests.support.servers.legacy_only import serve_legacy_only

LEGACY = os.environ.get("TB_ERA") == "legacy"
OBJECT = {"type": "object"}


class Eras(MCPServer):
    grown = False

    async def list_tools(self) -> list[Tool]:
        tools = [
            Tool(
                name="count",
                description="Answers {n}; its outputSchema wants an integer.",
                input_schema={"type": "object", "properties": {"n": {}}},
                output_schema={
                    "type": "object",
                    "properties": {"n": {"type": "integer"}},
                    "required": ["n"],
                },
                annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
                execution=ToolExecution(task_support="forbidden"),
            ),
            Tool(
                name="unshaped",
                description="Has an outputSchema, returns no structured content.",
                input_schema=OBJECT,
                output_schema={"type": "object", "properties": {"a": {"type": "string"}}},
            ),
            Tool(name="links", description="Links and embeds resources.", input_schema=OBJECT),
            Tool(name="meta", description="Answers the request's _meta.", input_schema=OBJECT),
            Tool(name="grow", description="Adds the tool grown.", input_schema=OBJECT),
        ]
        if not LEGACY:
            tools.append(
                Tool(
                    name="numbers",
                    description="Answers an array.",
                    input_schema=OBJECT,
                    output_schema={"type": "array", "items": {"type": "number"}},
                )
            )
        if self.grown:
            tools.append(Tool(name="grown", description="Grown.", input_schema=OBJECT))
        return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult:
        assert context is not None
        if name == "numbers":
            return _structured([1, 2.5, 3])
        if name == "count":
            return _structured({"n": arguments.get("n")})
        if name == "unshaped":
            return CallToolResult(content=[TextContent(type="text", text="no structure")])
        if name == "links":
            return CallToolResult(content=_links())
        if name == "meta":
            params: Any = context.request_context.params or {}
            return _structured({"meta": dict(params.get("_meta") or {})})
        if name == "grow":
            self.grown = True
            await context.notify_tools_changed()
            return CallToolResult(content=[TextContent(type="text", text="grew")])
        if name == "grown" and self.grown:
            return CallToolResult(content=[TextContent(type="text", text="grown here")])
        return CallToolResult(content=[TextContent(type="text", text=f"no {name}")], is_error=True)


def _structured(value: Any) -> CallToolResult:
    text = json.dumps(value)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=value)


def _links() -> list[Any]:
    return [
        TextContent(type="text", text="see these"),
        ResourceLink(
            type="resource_link",
            uri="file:///srv/report.pdf",
            name="report",
            mime_type="application/pdf",
        ),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="memo://today", mime_type="text/plain", text="the memo's text"
            ),
        ),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri="blob://one",
                mime_type="application/octet-stream",
                blob=base64.b64encode(b"\x00\x01bytes").decode(),
            ),
        ),
    ]


server = Eras("toolbus-test-eras")


if __name__ == "__main__":
    if LEGACY:
        anyio.run(serve_legacy_only, server)
    else:
        server.run()
