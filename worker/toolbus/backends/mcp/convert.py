"""Conversion between the mcp SDK's types and ours: listed tools, call results, failures.

Typed with the SDK's own models (`mcp_types`), so a change of their shape is a type
error here, not a surprise in a reply. A result is built without validating it again
(`model_construct`): the SDK has validated every field of it, and its structured content
was parsed from JSON, so it is JSON values by construction.
"""

from __future__ import annotations

import base64
import contextlib
import json

from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)
from mcp_types import Tool as ListedTool
from pydantic_core import to_json

from toolbus.config import ToolSettings
from toolbus.tools.registry import Invoke, Tool
from toolbus.wire.contracts import ContentItem, ToolResult
from toolbus.wire.errors import ToolbusError, ToolFailed

BAD_LINE_CHARS = 200

RESULT_TOO_LARGE = -32019
"""Ours, in JSON-RPC's implementation-defined band: an answer over `max_result_bytes`.

The stdio transport answers a request with it when the server's answer was too long to
read; like any error from a server, it costs only that call (`tool_error`).
"""


def to_tool(
    listed: ListedTool,
    name: str,
    *,
    server: str,
    rank: int,
    settings: ToolSettings,
    invoke: Invoke,
) -> Tool:
    """A listed tool as the pipeline sees it, under its (possibly sanitized) `name`."""
    return Tool(
        name=name,
        description=listed.description or "",
        input_schema=dict(listed.input_schema or {"type": "object"}),
        invoke=invoke,
        origin=f"mcp:{server}",
        server=server,
        original_name=listed.name if name != listed.name else None,
        rank=rank,
        rename_arguments=True,  # MCP schemas are someone else's: respell to match them
        idempotent_hint=_safe_to_repeat(listed),
        settings=settings,
        title=listed.title,
        annotations=(
            listed.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
            if listed.annotations is not None
            else None
        ),
        output_schema=dict(listed.output_schema) if listed.output_schema is not None else None,
        execution=(
            listed.execution.model_dump(mode="json", by_alias=True, exclude_none=True)
            if listed.execution is not None
            else None
        ),
    )


def _safe_to_repeat(listed: ListedTool) -> bool:
    """The server's own word (MCP tool annotations): read-only or idempotent."""
    hints = listed.annotations
    return hints is not None and bool(hints.read_only_hint or hints.idempotent_hint)


def to_result(result: CallToolResult) -> ToolResult:
    """A call's content as our result: text joined, other content carried, never dropped."""
    texts: list[str] = []
    other: list[ContentItem] = []
    for block in result.content:
        if isinstance(block, TextContent):
            texts.append(block.text)
        else:
            other.append(_content_item(block))
    # Whatever JSON value it is (2026-07-28 allows any; an array, a number): never dropped.
    return ToolResult.model_construct(
        text="\n".join(texts), structured=result.structured_content, content=other or None
    )


def _content_item(block: ContentBlock) -> ContentItem:
    """A non-text block, its fields as the SDK validated them."""
    if isinstance(block, ImageContent | AudioContent):
        return ContentItem.model_construct(
            type=block.type, mime_type=block.mime_type, data=block.data
        )
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        blob = resource.blob if isinstance(resource, BlobResourceContents) else None
        text = None if isinstance(resource, BlobResourceContents) else resource.text
        return ContentItem.model_construct(
            type=block.type,
            uri=str(resource.uri),
            mime_type=resource.mime_type,
            text=text,
            data=blob,
        )
    if isinstance(block, ResourceLink):
        return ContentItem.model_construct(
            type=block.type, uri=str(block.uri), mime_type=block.mime_type, name=block.name
        )
    # A content type newer than this code: carried whole, as base64 JSON.
    raw = json.dumps(block.model_dump(mode="json"), ensure_ascii=False)
    kind = str(getattr(block, "type", "unknown"))
    return ContentItem.model_construct(type=kind, data=base64.b64encode(raw.encode()).decode())


def checked_result(result: CallToolResult, server: str, limit_bytes: int) -> ToolResult:
    """A call's result as ours, or the error its caller gets: too large, or failed."""
    converted = to_result(result)
    size = result_bytes(converted)
    if size > limit_bytes:
        raise too_large(server, size, limit_bytes)
    if result.is_error:
        # The server's own words reach the caller unchanged.
        raise ToolFailed(converted.text, server=server)
    return converted


def result_bytes(result: ToolResult) -> int:
    """A result's size as its caller receives it: the bytes of its JSON."""
    return len(to_json(result))


def too_large(server: str, received_bytes: int, limit_bytes: int) -> ToolFailed:
    return ToolFailed(
        f"MCP server {server} answered with {received_bytes} bytes, over the limit of "
        f"{limit_bytes} (max_result_bytes)",
        server=server,
        limit_bytes=limit_bytes,
        received_bytes=received_bytes,
    )


def call_error(exc: MCPError, server: str) -> ToolbusError:
    """An error answer to `tools/call` (not a lost connection: `call.failure` tells), as
    the error the caller gets: `tool_error` with the server's code, whatever the code."""
    if exc.code == RESULT_TOO_LARGE and isinstance(exc.data, dict):
        limit, received = exc.data.get("limit_bytes"), exc.data.get("received_bytes")
        if isinstance(limit, int) and isinstance(received, int):
            return too_large(server, received, limit)
    return ToolFailed(exc.message, server=server, mcp_code=exc.code)


# What the mcp SDK's streamable HTTP transport says when it gives up on one request's
# response stream (`_resolve_abandoned_request`, mcp 2.x), with CONNECTION_CLOSED. Only its
# text tells it from a server's own -32000: a server's text that starts so gets the
# cautious answer (outcome unknown), never a lost session (`call.failure`).
SDK_LOST_RESPONSE = "SSE stream "

# Every error the SDK makes up itself, in place of an answer, when the exchange failed
# below JSON-RPC (mcp 2.x: its dispatcher once the connection closed; its streamable HTTP
# transport for a lost response stream, an HTTP error status without a JSON-RPC body, a
# 404, a 202 to a request, a redirect it did not follow, a body of another type or not
# JSON). The server's words are every other error: they come with the same codes, so
# the code and the start of the text together tell them apart.
SDK_STAND_INS = (
    (CONNECTION_CLOSED, "Connection closed"),
    (CONNECTION_CLOSED, SDK_LOST_RESPONSE),
    (INTERNAL_ERROR, "Server returned an error response"),
    (INVALID_REQUEST, "Session terminated"),
    (METHOD_NOT_FOUND, "Not Found"),
    (INVALID_REQUEST, "server answered a request with 202 Accepted"),
    (INVALID_REQUEST, "Redirect to "),
    (INVALID_REQUEST, "Unexpected content type"),
    (PARSE_ERROR, "Failed to parse JSON response"),
)


def stand_in(exc: MCPError) -> bool:
    """Whether `exc` is the SDK's account of a failed exchange, not the server's answer."""
    message = exc.error.message
    return any(exc.code == code and message.startswith(text) for code, text in SDK_STAND_INS)


def describe(exc: BaseException) -> str:
    """One line for a failure, groups flattened: for logs, states and error replies."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return "timed out while starting"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def bad_line(exc: Exception) -> str:
    """The start of a stdout line the SDK could not parse (from its validation error)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0].get("input")
            if isinstance(first, str | bytes):
                text = first.decode("utf-8", "replace") if isinstance(first, bytes) else first
                return text[:BAD_LINE_CHARS]
    return str(exc)[:BAD_LINE_CHARS]
