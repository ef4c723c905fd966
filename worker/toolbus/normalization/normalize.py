"""Normalize: argument keys to the schema's spelling, values to the shapes it asks for.

For every key, at every depth the schema describes, in order:
1. the exact property name: kept;
2. `static_map`: the configured per-tool map (dotted paths for nested keys);
3. a spelling-insensitive match (case, `_`, `-`, `.`, spaces ignored) against the
   properties at that level, reported as `snake_to_camel`, `camel_to_snake` or `spelling`;
4. `snake_to_camel` for an undeclared key where the object accepts additional
   properties and its declared names are camelCase;
5. otherwise kept, for validation to judge.
Steps 3-4 run only for tools that allow renaming (MCP tools by default). Then each value
is shaped as its schema asks (`wrap_array`, `parse_json`, `string_to_integer`,
`string_to_number`, `string_to_boolean`, `number_to_string`, `enum_case`), nothing
lossy, and missing optional properties with a non-null `default` are filled (`default`).
Values are never renamed. Two keys landing on one property are refused.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from toolbus.config import ALL_COERCIONS, for_tool
from toolbus.tools.registry import Tool
from toolbus.tools.shapes import ANY, Shape, json_type, spelling_key
from toolbus.wire.errors import InvalidArguments
from toolbus.wire.report import Change, describe

log = logging.getLogger("toolbus.normalize")

_INTEGER = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
MAX_REPORTED_VALUE_CHARS = 80
_NUMBERS = frozenset({"integer", "number"})  # json_type() of int and float; never bool


def snake_to_camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest if part)


def camel_to_snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


@dataclass
class StaticMap:
    """One level of a tool's static map; `children` by the canonical property name."""

    renames: dict[str, str] = field(default_factory=dict)
    children: dict[str, StaticMap] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.renames and not self.children

    @classmethod
    def from_config(cls, mapping: Mapping[str, str]) -> StaticMap:
        root = cls()
        for dotted, target in mapping.items():
            *parents, key = dotted.split(".")
            level = root
            for parent in parents:
                level = level.children.setdefault(parent, cls())
            level.renames[key] = target
        return root


EMPTY_MAP = StaticMap()


@dataclass(frozen=True, slots=True)
class ToolRules:
    """How one tool's arguments are normalized (from its settings; built once per tool)."""

    static: StaticMap = field(default_factory=StaticMap)
    rename: bool = False
    coercions: frozenset[str] = ALL_COERCIONS

    @classmethod
    def for_tool(cls, tool: Tool, static_map: Mapping[str, str] | None) -> ToolRules:
        skipped = set(tool.settings.skip_coercions)
        return cls(
            static=StaticMap.from_config(static_map or {}),
            rename=tool.renames_arguments,
            coercions=frozenset() if "all" in skipped else ALL_COERCIONS - skipped,
        )


def key_target(  # noqa: PLR0911 -- one return per rule, in the documented order
    key: str, shape: Shape, static: StaticMap, rename: bool
) -> tuple[str, str | None]:
    """The property `key` means at this level, and the rule that says so (None: kept)."""
    if key in shape.properties:
        return key, None
    if key in static.renames:
        return static.renames[key], "static_map"
    if not rename:
        return key, None
    target = shape.spellings.get(spelling_key(key))
    if target is not None:
        if snake_to_camel(key) == target:
            return target, "snake_to_camel"
        if camel_to_snake(key) == target:
            return target, "camel_to_snake"
        return target, "spelling"
    if shape.additional and shape.camel_case and "_" in key.strip("_"):
        camel = snake_to_camel(key)
        if camel != key and camel not in shape.properties:
            return camel, "snake_to_camel"
    return key, None


class Normalizer:
    """Normalizes arguments with each tool's rules: its settings plus its static map.

    `argument_maps` is keyed like every per-tool table (`config.for_tool`). Rules are
    built on a tool's first call and kept until the registry changes (`clear`).
    """

    def __init__(self, argument_maps: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self._maps = dict(argument_maps or {})
        self._cache: dict[int, tuple[Tool, ToolRules]] = {}

    def clear(self) -> None:
        """The registry changed: rebuild per-tool rules on next use."""
        self._cache.clear()

    def rules(self, tool: Tool) -> ToolRules:
        cached = self._cache.get(id(tool))
        if cached is not None and cached[0] is tool:
            return cached[1]
        rules = ToolRules.for_tool(tool, for_tool(self._maps, tool.name, tool.server))
        self._cache[id(tool)] = (tool, rules)
        return rules

    def arguments(
        self, tool: Tool, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], list[Change]]:
        rules = self.rules(tool)
        walk = _Walk(rules.rename, rules.coercions)
        out = walk.object(arguments, tool.shape, rules.static, "arguments")
        if walk.report:
            self.log_changes(tool, walk.report)
        return out, walk.report

    @staticmethod
    def log_changes(tool: Tool, changes: list[Change]) -> None:
        """What normalization changed in one call (keys, never values), at DEBUG: a call
        is one line at INFO (`call`), and the reply and span carry the report already.
        The text says the transformation (the seed's `{device_name: ...} -> {deviceName:
        ...}`, as docs/normalization.md shows it); the fields carry the same, to filter on."""
        if log.isEnabledFor(logging.DEBUG):
            changed = describe(changes)
            log.debug(
                "normalized %s: %s",
                tool.name,
                changed,
                extra={"tool": tool.name, "changes": changed},
            )


class _Walk:
    __slots__ = ("coercions", "rename", "report")

    def __init__(self, rename: bool, coercions: frozenset[str]) -> None:
        self.rename = rename
        self.coercions = coercions
        self.report: list[Change] = []

    def note(self, path: str, from_: str, to: str, rule: str) -> None:
        self.report.append(Change(path, from_, to, rule))

    def value(self, value: Any, shape: Shape, static: StaticMap, path: str) -> Any:
        if shape is not ANY:
            value = self.coerce(value, shape, path)
        if isinstance(value, dict) and (shape.properties or not static.empty):
            return self.object(value, shape, static, path)
        if isinstance(value, list) and (shape.items is not None or not static.empty):
            items = shape.items or ANY
            return [
                v  # as in `object`: a plain item needs no call
                if type(v) in items.kept_scalars and (items.enum is None or v in items.enum_texts)
                else self.value(v, items, static, f"{path}[{i}]")
                for i, v in enumerate(value)
            ]
        return value

    def object(
        self, value: dict[str, Any], shape: Shape, static: StaticMap, path: str
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        properties = shape.properties
        statics = static.children
        for key, item in value.items():
            if key in properties:  # `key()`'s first rule, without the call
                target, rule = key, None
            else:
                target, rule = self.key(key, shape, static)
            if target in out:
                first = next(k for k in value if self.key(k, shape, static)[0] == target)
                raise InvalidArguments(
                    f"arguments {first!r} and {key!r} at {path} both mean {target!r}",
                    conflict=[first, key],
                    property=target,
                    path=path,
                )
            if rule is not None:
                self.note(f"{path}.{key}", key, target, rule)
            child = properties.get(target, ANY)
            if type(item) in child.kept_scalars and (
                child.enum is None or item in child.enum_texts
            ):
                out[target] = item  # as `value()` would leave it: nothing to shape or walk
            else:
                out[target] = self.value(
                    item, child, statics.get(target, EMPTY_MAP), f"{path}.{target}"
                )
        if shape.defaults and "default" in self.coercions:
            for name, default in shape.defaults.items():
                if name not in out:
                    out[name] = copy.deepcopy(default)
                    self.note(f"{path}.{name}", "(absent)", _show(default), "default")
        return out

    def key(self, key: str, shape: Shape, static: StaticMap) -> tuple[str, str | None]:
        return key_target(key, shape, static, self.rename)

    def coerce(self, value: Any, shape: Shape, path: str) -> Any:
        kind = json_type(value)
        if kind == "string" and not shape.accepts("string"):
            value = self._from_string(value, shape, path)
            kind = json_type(value)
        elif kind in _NUMBERS and "string" in shape.types and not shape.accepts("integer"):
            # Only where no number at all is accepted: `["string", "integer"]` given 2.5
            # asked for an integer, not for text.
            text = _exact_text(value) if "number_to_string" in self.coercions else None
            if text is not None:
                self.note(path, kind, "string", "number_to_string")
                return text
        wrap = "wrap_array" in self.coercions and "array" in shape.types
        if wrap and kind != "array" and not shape.accepts(kind):
            self.note(path, kind, "array", "wrap_array")
            return [value]
        if shape.enum is not None and isinstance(value, str) and value not in shape.enum:
            declared = shape.enum_folded.get(value.casefold())
            if declared is not None and "enum_case" in self.coercions:
                self.note(path, _show(value), _show(declared), "enum_case")
                return declared
        return value

    def _from_string(self, text: str, shape: Shape, path: str) -> Any:
        c = self.coercions
        structured = "object" in shape.types or "array" in shape.types
        if structured and "parse_json" in c and text.lstrip()[:1] in ("{", "["):
            try:
                parsed = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
            except (ValueError, RecursionError):
                parsed = None
            if parsed is not None and shape.accepts(json_type(parsed)):
                self.note(path, "string", json_type(parsed), "parse_json")
                return parsed
        integer = _integer(text)
        if "integer" in shape.types and "string_to_integer" in c and integer is not None:
            self.note(path, "string", "integer", "string_to_integer")
            return integer
        if "number" in shape.types and "string_to_number" in c and _NUMBER.fullmatch(text):
            number = float(text)
            if math.isfinite(number) and (integer is not None or not _INTEGER.fullmatch(text)):
                self.note(path, "string", "number", "string_to_number")
                return number if integer is None else integer
        if (
            "boolean" in shape.types
            and "string_to_boolean" in c
            and text.lower() in ("true", "false")
        ):
            self.note(path, "string", "boolean", "string_to_boolean")
            return text.lower() == "true"
        return text


def _integer(text: str) -> int | None:
    """The integer `text` spells, or None: not digits, or more digits than Python turns
    into an int (`sys.get_int_max_str_digits()`, 4300): left as text, the schema's
    validation answers `invalid_arguments`, not a crash answering `internal`."""
    if not _INTEGER.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _exact_text(number: float) -> str | None:
    """The number as text when that text is exactly the number, else None.

    Integers always. A float only when its shortest repr is its exact binary value
    (`12.5`, `0.25`): `0.1` is not, so whatever digits the sender wrote cannot be told
    apart from the nearest double's and the text might not be theirs; never NaN or
    infinity (an overflowing `1e400` arrives as infinity).
    """
    if isinstance(number, int):
        try:
            return str(number)
        except ValueError:  # beyond `sys.get_int_max_str_digits()`: not for us to lift
            return None
    if not math.isfinite(number):
        return None
    text = repr(number)
    return text if Decimal(text) == Decimal(number) else None


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _finite(text: str) -> float:
    """`1e999` is JSON Python reads as infinity: not a value a tool can be given."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(text)
    return number


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return (
        text
        if len(text) <= MAX_REPORTED_VALUE_CHARS
        else text[: MAX_REPORTED_VALUE_CHARS - 1] + "…"
    )
