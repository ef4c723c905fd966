"""Tool definitions judged by the providers' own SDK types (offline, no network).

`checked_name(format, definition)` validates one definition of a `{prefix}/tools` listing
with the type the provider's SDK takes for it, refuses any field that type does not
declare (pydantic ignores unknown TypedDict keys; the providers' APIs refuse them), checks
the name against the providers' rule, and returns the name.
"""

from __future__ import annotations

import re
import typing
from typing import Any

import mcp_types
import ollama
from anthropic.types import ToolParam
from anthropic.types.tool_param import InputSchemaTyped
from openai.types.chat import ChatCompletionToolParam
from openai.types.chat.chat_completion_tool_param import FunctionDefinition
from openai.types.responses import FunctionToolParam
from pydantic import BaseModel, TypeAdapter

from toolbus.wire.contracts import ToolDefinition

# Anthropic's `Tool.name` pattern, and OpenAI's `FunctionDefinition.name` docstring
# ("a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum length of 64").
PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

FORMATS = ["anthropic", "openai", "openai-responses", "ollama", "mcp", "toolbus"]


def _declared(typed_dict: Any) -> set[str]:
    return set(typing.get_type_hints(typed_dict))


def _fields(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def checked_name(tools_format: str, definition: dict[str, Any]) -> str:
    """The definition's name, once the provider's SDK type has accepted the definition."""
    match tools_format:
        case "anthropic":
            TypeAdapter(ToolParam).validate_python(definition)
            # `input_schema` may also be any dict; the typed branch is what the API checks.
            TypeAdapter(InputSchemaTyped).validate_python(definition["input_schema"])
            assert set(definition) <= _declared(ToolParam)
            name = definition["name"]
        case "openai":
            TypeAdapter(ChatCompletionToolParam).validate_python(definition)
            assert set(definition) <= _declared(ChatCompletionToolParam)
            assert set(definition["function"]) <= _declared(FunctionDefinition)
            assert definition["function"]["parameters"]["type"] == "object"
            assert "properties" in definition["function"]["parameters"]
            name = definition["function"]["name"]
        case "openai-responses":
            TypeAdapter(FunctionToolParam).validate_python(definition)
            assert set(definition) <= _declared(FunctionToolParam)
            assert definition["parameters"]["type"] == "object"
            assert "properties" in definition["parameters"]
            name = definition["name"]
        case "ollama":
            tool = ollama.Tool.model_validate(definition)
            assert set(definition) <= _fields(ollama.Tool)
            assert set(definition["function"]) <= _fields(ollama.Tool.Function)
            assert tool.function is not None and tool.function.parameters is not None
            assert tool.function.parameters.type == "object"
            name = definition["function"]["name"]
        case "mcp":
            listed = mcp_types.Tool.model_validate(definition)
            # Nothing we sent is lost on the way into the SDK's model.
            assert listed.model_dump(by_alias=True, exclude_none=True) == definition
            assert listed.input_schema["type"] == "object"
            name = listed.name
        case "toolbus":
            return ToolDefinition.model_validate(definition).name
        case _:
            raise AssertionError(f"no SDK type for {tools_format}")
    assert isinstance(name, str) and PROVIDER_NAME.match(name), name
    return name
