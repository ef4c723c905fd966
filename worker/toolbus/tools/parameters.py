"""Parameters: a tool's top-level parameters as a model reads them, summarised once per tool.

An `invalid_arguments` reply carries them (`details.parameters`) so that a model which
called a tool wrongly can correct its next call: each parameter's `name`, its `type` as
the schema says it (`"string"`, `"array"`, `"string|null"`; `"any"` where the schema
does not constrain it), whether it is `required`, its `enum` and a short `description`.
Built when the tool is (`registry.Tool`), from the shapes normalization uses, so a
refused call costs no schema walk. Bounded: a schema from an MCP server may be large.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from toolbus.tools.shapes import Shape, json_type

MAX_PARAMETERS = 50
MAX_ENUM_VALUES = 50
MAX_DESCRIPTION_CHARS = 200
ANY_TYPE = "any"  # no `type`, properties, items or enum: the schema accepts anything there

# The order types are named in: scalars before containers, `null` last (`string|null`).
_TYPE_ORDER = ("string", "integer", "number", "boolean", "array", "object", "null")


@dataclass(frozen=True, slots=True)
class Parameters:
    """What `invalid_arguments` adds to its details for one tool: JSON values, ready."""

    listed: tuple[dict[str, Any], ...]
    omitted: int  # parameters past MAX_PARAMETERS, left out of `listed`
    signature: tuple[dict[str, Any], ...]  # the older `details.signature`, kept for callers

    def details(self) -> dict[str, Any]:
        """Fresh entries and lists: a reply's details are its own, whatever later edits them."""
        details: dict[str, Any] = {
            "parameters": [_fresh(entry) for entry in self.listed],
            "signature": [_fresh(entry) for entry in self.signature],
        }
        if self.omitted:
            details["parameters_omitted"] = self.omitted
        return details


def _fresh(entry: dict[str, Any]) -> dict[str, Any]:
    """A copy of one entry with its lists copied (`enum`, a list `type`): far cheaper than
    `deepcopy`; the values inside are JSON scalars but for the rare object in an enum."""
    return {key: list(value) if isinstance(value, list) else value for key, value in entry.items()}


def summarize(schema: dict[str, Any], shape: Shape) -> Parameters:
    """The parameters of a tool whose input schema is `schema` and shape `shape`."""
    raw = schema.get("properties")
    raw_properties: dict[str, Any] = raw if isinstance(raw, dict) else {}
    names = list(shape.properties)
    # Over the bound, required parameters are kept first: a call cannot succeed without them.
    kept = sorted(names, key=lambda n: n not in shape.required)[:MAX_PARAMETERS]
    chosen = set(kept)
    listed = [
        _parameter(name, shape.properties[name], raw_properties.get(name), name in shape.required)
        for name in names
        if name in chosen
    ]
    # Copied once from the schema (enum values, raw types): nothing shared with it.
    return Parameters(
        listed=tuple(copy.deepcopy(listed)),
        omitted=len(names) - len(listed),
        signature=tuple(copy.deepcopy(_signature(schema))),
    )


def _parameter(name: str, shape: Shape, raw: Any, required: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "type": type_text(shape), "required": required}
    if shape.enum is not None:
        entry["enum"] = list(shape.enum[:MAX_ENUM_VALUES])
        if len(shape.enum) > MAX_ENUM_VALUES:
            entry["enum_omitted"] = len(shape.enum) - MAX_ENUM_VALUES
    description = raw.get("description") if isinstance(raw, dict) else None
    if isinstance(description, str) and description.strip():
        entry["description"] = _cut(description.strip())
    return entry


def type_text(shape: Shape) -> str:
    """`"string"`, `"string|null"`, ...: the JSON types the shape accepts, in a fixed order."""
    types = set(shape.types)
    if not types:
        if shape.properties:
            types = {"object"}
        elif shape.items is not None:
            types = {"array"}
        elif shape.enum is not None:
            types = {json_type(value) for value in shape.enum}
    known = [t for t in _TYPE_ORDER if t in types]
    return "|".join(known) if known else ANY_TYPE


def _cut(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return text[: MAX_DESCRIPTION_CHARS - 1].rstrip() + "…"


def _signature(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """`details.signature` as it always was: the raw `type` (or `anyOf` types) and `enum`."""
    listed = schema.get("required")
    required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
    properties = schema.get("properties")
    params = []
    for name, prop in (properties if isinstance(properties, dict) else {}).items():
        entry: dict[str, Any] = {"name": name, "required": name in required}
        if isinstance(prop, dict):
            if "type" in prop:
                entry["type"] = prop["type"]
            elif isinstance(prop.get("anyOf"), list):
                entry["type"] = [p.get("type") for p in prop["anyOf"] if isinstance(p, dict)]
            if "enum" in prop:
                entry["enum"] = prop["enum"]
        params.append(entry)
        if len(params) == MAX_PARAMETERS:
            break  # the same bound as `parameters`: it used to be unbounded
    return params
