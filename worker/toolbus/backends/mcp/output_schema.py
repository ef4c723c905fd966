"""A tool result that breaks the tool's own `outputSchema`, as its caller's error.

The mcp SDK checks every successful `tools/call` result against the `outputSchema` the
server listed for the tool (`ClientSession.validate_tool_result`) and raises a bare
`RuntimeError` when it does not hold; left alone, that reached the caller as `internal`
(a bug in toolbus), when it is the server's fault and costs that call only. Here it
becomes `tool_error` with `details.reason`:

    output_schema          the structured content breaks the schema, or is missing;
                           `details.errors`: where (`path`, a JSON Pointer into the
                           structured content) and which rule (`keyword`), never the value
    output_schema_invalid  the schema itself is not a usable JSON Schema

The SDK's own message quotes the offending value (a caller's data, perhaps a secret): it
is never passed on, logged, or chained.
"""

from __future__ import annotations

from collections.abc import Iterable

from jsonschema import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from toolbus.wire.errors import ToolFailed

# What the SDK says (mcp 2.x, `validate_tool_result`) when a tool with an output schema
# answered without structured content: the one case with no exception chained to tell it.
_MISSING = "has an output schema but did not return structured content"


def schema_violation(exc: RuntimeError, server: str, tool: str) -> ToolFailed | None:
    """The caller's error for the SDK's output-schema `RuntimeError`; None for any other."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ValidationError):
        path = _pointer(cause.absolute_path)
        return ToolFailed(
            f"MCP server {server}: the result of {tool} does not match the tool's "
            f"outputSchema at {path or '/'} ({cause.validator})",
            server=server,
            reason="output_schema",
            errors=[{"path": path, "keyword": str(cause.validator)}],
        )
    if isinstance(cause, SchemaError | Unresolvable):
        return ToolFailed(
            f"MCP server {server}: the outputSchema of {tool} is not a usable JSON Schema",
            server=server,
            reason="output_schema_invalid",
        )
    if _MISSING in str(exc):
        return ToolFailed(
            f"MCP server {server}: {tool} has an outputSchema but returned no structured content",
            server=server,
            reason="output_schema",
            errors=[{"path": "", "keyword": "required"}],
        )
    return None


def _pointer(steps: Iterable[str | int]) -> str:
    """A JSON Pointer (RFC 6901) for a path of keys and indexes."""
    return "".join("/" + str(step).replace("~", "~0").replace("/", "~1") for step in steps)
