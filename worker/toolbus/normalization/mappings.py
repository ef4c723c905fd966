"""Mappings: what normalization will accept for each tool, as Markdown.

`toolbus mappings [TOOL]` prints it from the same shapes and rules the pipeline uses,
so the documentation of the mapping is the mapping. An MCP server chose its tools'
parameter names, enum values and defaults, and the name it announced: each line is made
printable, so none of them runs a terminal's escape sequences or breaks a line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from toolbus.normalization.normalize import (
    Normalizer,
    StaticMap,
    ToolRules,
    camel_to_snake,
    snake_to_camel,
)
from toolbus.tools.registry import Registry, Tool
from toolbus.tools.shapes import Shape
from toolbus.wire.untrusted import printable

MAX_DEPTH = 8  # recursive schemas are shown this deep


@dataclass(frozen=True, slots=True)
class _Context:
    rules: ToolRules
    rename: bool


def render(registry: Registry, normalizer: Normalizer, tool_name: str | None = None) -> str:
    tools = [registry.resolve(tool_name).tool] if tool_name else registry.tools()
    aliases = registry.alias_targets()
    return "\n".join(_tool(registry, normalizer, tool, aliases) for tool in tools)


def _tool(registry: Registry, normalizer: Normalizer, tool: Tool, aliases: dict[str, str]) -> str:
    shown = registry.shown_name(tool)
    rules = normalizer.rules(tool)
    rename = rules.rename
    names = [f"`{shown}`"]
    if tool.server:
        names += [f"`{tool.server}.{tool.name}`", f"`{tool.server}__{tool.name}`"]
    own = (shown, tool.qualified_name)
    names += [f"`{a}` (alias)" for a, target in sorted(aliases.items()) if target in own]
    names.append("any spelling ignoring case, `_`, `-`, `.` and spaces, when unambiguous")
    announced = f" (announced as `{tool.original_name}`)" if tool.original_name else ""
    respelled = "yes" if rename else "no (exact names and static maps only)"
    lines = [
        f"## {shown}",
        "",
        f"Origin: {tool.origin}{announced}. Argument keys respelled: {respelled}.",
        "",
        "Tool name accepted as: " + ", ".join(names) + ".",
        "",
        "| parameter | type | keys accepted | value shaping | default |",
        "|---|---|---|---|---|",
    ]
    rows = list(_rows(tool.shape, rules.static, _Context(rules, rename), "", frozenset()))
    lines += rows or ["| (none) | | | | |"]
    return "".join(f"{printable(line)}\n" for line in lines)


def _rows(
    shape: Shape, static: StaticMap, ctx: _Context, prefix: str, seen: frozenset[int]
) -> Iterator[str]:
    if len(seen) >= MAX_DEPTH or id(shape) in seen:
        return
    seen = seen | {id(shape)}
    mapped: dict[str, list[str]] = {}
    for source, target in static.renames.items():
        mapped.setdefault(target, []).append(source)
    for name, child in shape.properties.items():
        path = f"{prefix}{name}"
        statics = mapped.get(name, [])
        keys = [f"`{name}`"] + [f"`{s}` (static map)" for s in statics]
        if ctx.rename:
            variants = {snake_to_camel(name), camel_to_snake(name), name[:1].upper() + name[1:]}
            keys += [f"`{v}`" for v in sorted(variants - {name, *statics})] + ["other spellings"]
        required = " (required)" if name in shape.required else ""
        shown_default = f"`{_json(shape.defaults[name])}`" if name in shape.defaults else ""
        yield (
            f"| `{path}`{required} | {_types(child)} | {', '.join(keys)} | "
            f"{_shaping(child, ctx.rules)} | {shown_default} |"
        )
        next_static = static.children.get(name, StaticMap())
        yield from _rows(child, next_static, ctx, f"{path}.", seen)
        if child.items is not None:
            yield from _rows(child.items, next_static, ctx, f"{path}[].", seen)


def _types(shape: Shape) -> str:
    text = " \\| ".join(sorted(shape.types)) or "any"
    if shape.enum is not None:
        text += " (" + ", ".join(f"`{_json(v)}`" for v in shape.enum) + ")"
    return text


def _json(value: object) -> str:
    """A schema's value as JSON, as the table writes values (`false`, `null`, `"on"`),
    not as Python would (`False`, `None`, `on`)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON after all (a schema from a Python tool)
        return str(value)


def _shaping(shape: Shape, rules: ToolRules) -> str:
    applicable = []
    if "array" in shape.types:
        applicable.append("scalar -> `[scalar]` (wrap_array)")
    if "object" in shape.types or "array" in shape.types:
        applicable.append("JSON text -> value (parse_json)")
    if "integer" in shape.types:
        applicable.append('`"5"` -> `5` (string_to_integer)')
    elif "number" in shape.types:
        applicable.append('`"2.5"` -> `2.5` (string_to_number)')
    if "boolean" in shape.types:
        applicable.append('`"true"` -> `true` (string_to_boolean)')
    if "string" in shape.types and not shape.accepts("integer"):
        applicable.append('`1234` -> `"1234"` (number_to_string)')
    if shape.enum_folded:
        applicable.append("any letter case -> declared value (enum_case)")
    kept = [a for a in applicable if a.rsplit("(", 1)[1].rstrip(")") in rules.coercions]
    return "; ".join(kept) or "as sent"
