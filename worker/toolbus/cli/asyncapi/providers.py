"""The AI providers' shapes on our topics, as JSON Schema: what `formats/*` read and write.

Three kinds, each per provider:
- the tool calls a request may carry as the provider's SDK emitted them
  (`formats/incoming.py`), with our options beside them under `toolbus`;
- one item of what a reply in the provider's format appends to the conversation
  (`formats/outgoing.py`);
- one tool definition as `{prefix}/tools` lists it in the provider's shape
  (`formats/definitions.py`).

Each schema names what the worker reads or writes and allows the rest: a provider's
other fields (a block's `caller`, a completion's `usage`) mean nothing to the worker.
The tests hold these schemas to what the code and the providers' SDK types do.
"""

from __future__ import annotations

from typing import Any

from toolbus.cli.asyncapi.wire import COMPONENT_SCHEMAS
from toolbus.wire.contracts import ReplyFormat, ToolsFormat
from toolbus.wire.formats.incoming import MAX_NAME_CHARS

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": COMPONENT_SCHEMAS + name}


def _object(required: list[str], description: str, /, **properties: Schema) -> Schema:
    return {
        "type": "object",
        "description": description,
        "required": required,
        "properties": properties,
    }


_OPTIONS = {"toolbus": _ref("Options")}
_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}
_ID: Schema = {"type": "string"}
_JSON_TEXT: Schema = {"type": "string", "description": "A JSON object, as text."}
_ARGUMENTS: Schema = {"type": "object"}
_INPUT_SCHEMA: Schema = {
    "type": "object",
    "description": "A JSON Schema of type `object`, with `properties`.",
    "required": ["type", "properties"],
    "properties": {"type": {"const": "object"}, "properties": {"type": "object"}},
}


def _const(value: str | bool) -> Schema:
    return {"const": value}


# -- requests ---------------------------------------------------------------------------

_ANTHROPIC_REQUESTS: dict[str, Schema] = {
    "AnthropicToolUse": _object(
        ["type", "name"],
        "A `tool_use` content block (`anthropic.types.ToolUseBlock`).",
        type=_const("tool_use"),
        id=_ID,
        name=_NAME,
        input=_ARGUMENTS,
        **_OPTIONS,
    ),
    "AnthropicContent": {
        "type": "array",
        "description": "A message's content blocks; its `tool_use` blocks are the calls, "
        "text and thinking blocks are ignored. A bare list carries no options.",
        "items": {"type": "object"},
        "contains": _ref("AnthropicToolUse"),
    },
    "AnthropicMessage": {
        **_object(
            ["content"],
            "An assistant message (`anthropic.types.Message`, or a `MessageParam` "
            "with `role`); its `id` is the reply's.",
            type=_const("message"),
            role=_const("assistant"),
            id=_ID,
            content=_ref("AnthropicContent"),
            **_OPTIONS,
        ),
        "anyOf": [{"required": ["role"]}, {"required": ["type"]}],
    },
}

_CHAT_REQUESTS: dict[str, Schema] = {
    "ChatToolCall": _object(
        ["id", "function"],
        "A Chat Completions tool call (`ChatCompletionMessageToolCall`).",
        id=_ID,
        type=_const("function"),
        function=_object(["name"], "The function to call.", name=_NAME, arguments=_JSON_TEXT),
        **_OPTIONS,
    ),
    "ChatToolCalls": {
        "type": "array",
        "description": "A message's `tool_calls`, bare (no options).",
        "items": _ref("ChatToolCall"),
        "minItems": 1,
    },
    "ChatAssistantMessage": _object(
        ["tool_calls"],
        "An assistant message with tool calls (`ChatCompletionMessage`).",
        role=_const("assistant"),
        tool_calls={"type": "array", "items": _ref("ChatToolCall"), "minItems": 1},
        **_OPTIONS,
    ),
    "ChatCompletion": _object(
        ["choices"],
        "A whole `ChatCompletion`: the calls of its first choice; its `id` is the reply's.",
        id=_ID,
        object=_const("chat.completion"),
        choices={
            "type": "array",
            "minItems": 1,
            "items": _object(["message"], "A choice.", message=_ref("ChatAssistantMessage")),
        },
        **_OPTIONS,
    ),
}

_RESPONSES_REQUESTS: dict[str, Schema] = {
    "ResponsesFunctionCall": _object(
        ["type", "name"],
        "A `function_call` output item (`ResponseFunctionToolCall`), keyed by `call_id`.",
        type=_const("function_call"),
        call_id=_ID,
        name=_NAME,
        arguments=_JSON_TEXT,
        **_OPTIONS,
    ),
    "ResponsesOutput": {
        "type": "array",
        "description": "A response's `output` items, bare; reasoning and message items are "
        "ignored.",
        "items": {"type": "object"},
        "contains": _ref("ResponsesFunctionCall"),
    },
    "Response": _object(
        ["output"],
        'A whole `Response` (or just `{"output": [...]}`); its `id` is the reply\'s.',
        id=_ID,
        object=_const("response"),
        output=_ref("ResponsesOutput"),
        **_OPTIONS,
    ),
}

_OLLAMA_REQUESTS: dict[str, Schema] = {
    "OllamaToolCall": _object(
        ["function"],
        "An Ollama tool call (`ollama.Message.ToolCall`): no id, arguments as an object. "
        "Calls get `{toolbus.id}:{n}` as their ids, or generated ones.",
        function=_object(["name"], "The function to call.", name=_NAME, arguments=_ARGUMENTS),
        **_OPTIONS,
    ),
    "OllamaMessage": _object(
        ["tool_calls"],
        "An assistant message whose tool calls carry no ids.",
        role=_const("assistant"),
        tool_calls={"type": "array", "items": _ref("OllamaToolCall"), "minItems": 1},
        **_OPTIONS,
    ),
    "OllamaChatResponse": _object(
        ["message"],
        "A whole chat response (`ollama.ChatResponse`): the calls of its `message`.",
        model={"type": "string"},
        message=_ref("OllamaMessage"),
        **_OPTIONS,
    ),
}

REQUESTS: dict[ReplyFormat, dict[str, Schema]] = {
    ReplyFormat.ANTHROPIC: _ANTHROPIC_REQUESTS,
    ReplyFormat.OPENAI: _CHAT_REQUESTS,
    ReplyFormat.OPENAI_RESPONSES: _RESPONSES_REQUESTS,
    ReplyFormat.OLLAMA: _OLLAMA_REQUESTS,
}
"""Per provider, its request shapes by component name."""

# -- what a reply appends ---------------------------------------------------------------

_TEXT = {"type": "string"}
APPENDED: dict[ReplyFormat, tuple[str, Schema]] = {
    ReplyFormat.ANTHROPIC: (
        "AnthropicToolResults",
        _object(
            ["role", "content"],
            "One `user` message of `tool_result` blocks (`MessageParam`).",
            role=_const("user"),
            content={
                "type": "array",
                "items": _object(
                    ["type", "tool_use_id", "content"],
                    "One call's result (`ToolResultBlockParam`).",
                    type=_const("tool_result"),
                    tool_use_id=_ID,
                    content={"type": "array", "items": {"type": "object"}},
                    is_error=_const(True),
                ),
            },
        ),
    ),
    ReplyFormat.OPENAI: (
        "ChatToolMessage",
        {
            "description": "A `tool` message per call; after them, a `user` message with "
            "the results' images, if any.",
            "oneOf": [
                _object(
                    ["role", "tool_call_id", "content"],
                    "One call's result (`ChatCompletionToolMessageParam`).",
                    role=_const("tool"),
                    tool_call_id=_ID,
                    content=_TEXT,
                ),
                _object(
                    ["role", "content"],
                    "The images (`ChatCompletionUserMessageParam`).",
                    role=_const("user"),
                    content={"type": "array", "items": {"type": "object"}},
                ),
            ],
        },
    ),
    ReplyFormat.OPENAI_RESPONSES: (
        "ResponsesFunctionCallOutput",
        _object(
            ["type", "call_id", "output"],
            "One call's result (`FunctionCallOutput` input item).",
            type=_const("function_call_output"),
            call_id=_ID,
            output={"oneOf": [_TEXT, {"type": "array", "items": {"type": "object"}}]},
        ),
    ),
    ReplyFormat.OLLAMA: (
        "OllamaToolMessage",
        _object(
            ["role", "tool_name", "content"],
            "One call's result (`ollama.Message`), in the calls' order.",
            role=_const("tool"),
            tool_name=_NAME,
            content=_TEXT,
            images={"type": "array", "items": {"type": "string", "contentEncoding": "base64"}},
        ),
    ),
}
"""Per provider, the component name and schema of one item of `CallsReply.append`."""

# -- tool definitions -------------------------------------------------------------------

_DESCRIPTION = {"type": "string"}
_CHAT_TOOL = _object(
    ["type", "function"],
    "`ChatCompletionFunctionToolParam` (OpenAI Chat Completions and Ollama).",
    type=_const("function"),
    function=_object(
        ["name", "parameters"],
        "The function.",
        name=_NAME,
        description=_DESCRIPTION,
        parameters=_INPUT_SCHEMA,
    ),
)
DEFINITIONS: dict[ToolsFormat, tuple[str, Schema]] = {
    ToolsFormat.ANTHROPIC: (
        "AnthropicTool",
        _object(
            ["name", "input_schema"],
            "`anthropic.types.ToolParam`.",
            name=_NAME,
            description=_DESCRIPTION,
            input_schema=_INPUT_SCHEMA,
        ),
    ),
    ToolsFormat.OPENAI: ("ChatFunctionTool", _CHAT_TOOL),
    ToolsFormat.OLLAMA: ("ChatFunctionTool", _CHAT_TOOL),
    ToolsFormat.OPENAI_RESPONSES: (
        "ResponsesFunctionTool",
        _object(
            ["type", "name", "parameters", "strict"],
            "`openai.types.responses.FunctionToolParam`.",
            type=_const("function"),
            name=_NAME,
            description=_DESCRIPTION,
            parameters=_INPUT_SCHEMA,
            strict=_const(False),
            output_schema={"type": "object"},
        ),
    ),
    ToolsFormat.MCP: (
        "McpTool",
        _object(
            ["name", "inputSchema"],
            "An MCP `Tool`: `title`, `outputSchema`, `annotations` and `execution` when "
            "the MCP server gave them.",
            name=_NAME,
            title=_DESCRIPTION,
            description=_DESCRIPTION,
            inputSchema=_INPUT_SCHEMA,
            outputSchema={"type": "object"},
            annotations={"type": "object"},
            execution={"type": "object"},
        ),
    ),
}
"""Per tools format but ours (`ToolDefinition`), the component name and schema of one
definition in `result.structured.tools`."""


def provider_schemas() -> dict[str, Schema]:
    """Component name -> schema, every shape above."""
    schemas: dict[str, Schema] = {}
    for shapes in REQUESTS.values():
        schemas.update(shapes)
    for name, schema in (*APPENDED.values(), *DEFINITIONS.values()):
        schemas[name] = schema
    return schemas
