"""Definitions: the tools a caller may use, in the shape its provider's SDK takes.

A request on `{prefix}/tools` names the shape in `format` (`ToolsFormat`); the list goes
to the provider as it is, so each definition holds the provider's fields and no others:

- `anthropic`: `{name, description, input_schema}` (a `ToolParam`);
- `openai` and `ollama`: `{type: "function", function: {name, description, parameters}}`
  (Chat Completions' `ChatCompletionFunctionToolParam`, Ollama's `Tool`);
- `openai-responses`: `{type: "function", name, description, parameters, strict,
  output_schema}` (`FunctionToolParam`; `strict` false, as our schemas are not written
  for strict mode; `output_schema` when the MCP tool has an `outputSchema`);
- `mcp`: an MCP `Tool`: `{name, title, description, inputSchema, outputSchema,
  annotations, execution}`;
- `toolbus`: our own `ToolList` entries (canonical names, origin, original name, and the
  MCP tool's title, outputSchema, annotations and execution).

Beside `tools`, every format's list says which MCP servers were not ready when it was
made (`pending`, our `PendingServer`s): the definitions themselves stay the provider's.
The MCP fields a provider's definition has no place for (Anthropic's `ToolParam`, Chat
Completions' `FunctionDefinition` and Ollama's `Tool` have none for `outputSchema`,
`annotations` or `execution`, and the APIs refuse fields they do not know) are listed
beside the definitions instead, in `mcp` (provider name -> those fields, for the tools that
have any): for the application (a gate on `destructiveHint`, a check of a result), never
sent to the model.

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

    mcp: dict[str, Definition] = field(default_factory=dict)  # beside a provider's definitions

    def structured(self) -> dict[str, Any]:
        """The `result.structured` of a `{prefix}/tools` reply: the definitions, the
        servers whose tools they may lack (`ToolList.pending`), and the MCP fields the
        provider's definitions have no place for (`mcp`, when any tool has some)."""
        listed = {"tools": self.definitions, "pending": [p.model_dump() for p in self.pending]}
        return {**listed, "mcp": self.mcp} if self.mcp else listed


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
        dumped = [_without_absent(d) for d in ours.model_dump(by_alias=True)["tools"]]
        return Listing(tools_format, names, dumped, [*pending])
    shape = _shape(tools_format)
    tools = registry.listed(allowed)
    names = [registry.provider_name(tool) for tool in tools]
    definitions = [shape(name, tool) for name, tool in zip(names, tools, strict=True)]
    beside: dict[str, Definition] = {}
    if tools_format not in (ToolsFormat.MCP,):  # MCP's `Tool` has a place for each
        for name, tool in zip(names, tools, strict=True):
            if fields := _mcp_fields(tool):
                beside[name] = fields
    return Listing(tools_format, names, definitions, [*pending], beside)


_MCP_ONLY = ("title", "outputSchema", "annotations", "execution")


def _without_absent(definition: Definition) -> Definition:
    """Our definition without the MCP-only fields a tool lacks (a local tool has none)."""
    return {k: v for k, v in definition.items() if v is not None or k not in _MCP_ONLY}


def _mcp_fields(tool: Tool) -> Definition:
    """The MCP tool's fields a provider's definition has no place for."""
    fields: Definition = {}
    if tool.output_schema is not None:
        fields["outputSchema"] = tool.output_schema
    if tool.annotations:
        fields["annotations"] = tool.annotations
    if tool.execution:
        fields["execution"] = tool.execution
    return fields


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
        # The only provider shape with a place for it (`FunctionToolParam.output_schema`).
        **({"output_schema": tool.output_schema} if tool.output_schema is not None else {}),
    }


def _mcp(name: str, tool: Tool) -> Definition:
    definition: Definition = {"name": name}
    if tool.title:
        definition["title"] = tool.title
    definition.update(_description(tool))
    definition["inputSchema"] = object_schema(tool.input_schema)
    if tool.output_schema is not None:
        definition["outputSchema"] = tool.output_schema
    if tool.annotations:
        definition["annotations"] = tool.annotations
    if tool.execution:
        definition["execution"] = tool.execution
    return definition


def _description(tool: Tool) -> Definition:
    """Only a description that says something: every provider takes its absence."""
    return {"description": tool.description} if tool.description else {}
