"""Definitions: the tools a caller may use, in the shape its provider's SDK takes.

A request on `{prefix}/tools` names the shape in `format` (`ToolsFormat`); the list goes
to the provider as it is, so each definition holds the provider's fields and no others:

- `anthropic`: `{name, description, input_schema}` (a `ToolParam`);
- `openai` and `ollama`: `{type: "function", function: {name, description, parameters}}`
  (Chat Completions' `ChatCompletionFunctionToolParam`, Ollama's `Tool`);
- `openai-responses`: `{type: "function", name, description, parameters, strict}`
  (`FunctionToolParam`; `strict` false, as our schemas are not written for strict mode);
- `mcp`: an MCP `Tool`: `{name, title, description, inputSchema, annotations}`;
- `toolbus`: our own `ToolList` entries (canonical names, origin, original name).

Beside `tools`, every format's list says which MCP servers were not ready when it was
made (`pending`, our `PendingServer`s): the definitions themselves stay the provider's.

Every format but ours lists a tool under its provider name (`toolbus.wire.formats.names`),
which the registry resolves back to the same tool. Every schema but ours is an object
schema with `properties`: Anthropic requires `type: "object"`, OpenAI refuses an object
schema without `properties`, and a tool's arguments are an object whatever its schema
says, so neither addition changes what the tool accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

from toolbus.tools.registry import Registry, Tool
from toolbus.wire.contracts import PendingServer, ToolList, ToolsFormat

Definition = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Listing:
    """The tools a caller may use, as names and as definitions, in one format."""

    format: ToolsFormat
    names: list[str]
    definitions: list[Definition]
    pending: list[PendingServer] = field(default_factory=list)

    def structured(self) -> dict[str, Any]:
        """The `result.structured` of a `{prefix}/tools` reply: the definitions, and the
        servers whose tools they may lack (`ToolList.pending`)."""
        return {"tools": self.definitions, "pending": [p.model_dump() for p in self.pending]}


def listing(
    registry: Registry,
    tools_format: ToolsFormat,
    allowed: Callable[[Tool], bool] | None = None,
    pending: Sequence[PendingServer] = (),
) -> Listing:
    """The `allowed` tools a model may be offered, in `tools_format`; `pending`: the MCP
    servers not ready meanwhile."""
    if tools_format is ToolsFormat.TOOLBUS:
        ours = ToolList(tools=registry.definitions(allowed))
        names = [t.name for t in ours.tools]
        return Listing(tools_format, names, ours.model_dump(by_alias=True)["tools"], [*pending])
    shape = _shape(tools_format)
    tools = registry.listed(allowed)
    names = [registry.provider_name(tool) for tool in tools]
    definitions = [shape(name, tool) for name, tool in zip(names, tools, strict=True)]
    return Listing(tools_format, names, definitions, [*pending])


def object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The tool's schema as every provider accepts it: an object with `properties`."""
    return {**schema, "type": "object", "properties": schema.get("properties", {})}


def _shape(tools_format: ToolsFormat) -> Callable[[str, Tool], Definition]:
    match tools_format:
        case ToolsFormat.ANTHROPIC:
            return _anthropic
        case ToolsFormat.OPENAI | ToolsFormat.OLLAMA:
            return _chat_function
        case ToolsFormat.OPENAI_RESPONSES:
            return _responses_function
        case ToolsFormat.MCP:
            return _mcp
        case ToolsFormat.TOOLBUS:
            raise ValueError("the toolbus format is a ToolList, not a provider shape")
        case _:
            assert_never(tools_format)


def _anthropic(name: str, tool: Tool) -> Definition:
    return {"name": name, **_description(tool), "input_schema": object_schema(tool.input_schema)}


def _chat_function(name: str, tool: Tool) -> Definition:
    function = {"name": name, **_description(tool), "parameters": object_schema(tool.input_schema)}
    return {"type": "function", "function": function}


def _responses_function(name: str, tool: Tool) -> Definition:
    return {
        "type": "function",
        "name": name,
        **_description(tool),
        "parameters": object_schema(tool.input_schema),
        # The SDK's type requires the field. Strict mode would need every property
        # required and `additionalProperties: false`, which our schemas do not promise.
        "strict": False,
    }


def _mcp(name: str, tool: Tool) -> Definition:
    definition: Definition = {"name": name}
    if tool.title:
        definition["title"] = tool.title
    definition.update(_description(tool))
    definition["inputSchema"] = object_schema(tool.input_schema)
    if tool.annotations:
        definition["annotations"] = tool.annotations
    return definition


def _description(tool: Tool) -> Definition:
    """Only a description that says something: every provider takes its absence."""
    return {"description": tool.description} if tool.description else {}
