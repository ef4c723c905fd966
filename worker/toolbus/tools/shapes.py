"""Shapes: what a tool's JSON schema says each argument should look like, precomputed.

Built once per tool at registration, then only looked up: for every object node its
properties, the spellings that lead to each property, defaults and `additionalProperties`;
for arrays the item shape; for scalars the accepted types and enum spellings. Local
`$ref`s (`#/$defs/...`) are followed; `allOf` merges; `anyOf`/`oneOf` merge only when
unambiguous. Recursive schemas are fine: a `$ref` already being built is shared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

JSON_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})
_SEPARATORS = re.compile(r"[\s_\-.]+")


def spelling_key(name: str) -> str:
    """The spelling-insensitive key of a name: case, `_`, `-`, `.` and spaces ignored."""
    return _SEPARATORS.sub("", name).casefold()


@dataclass(eq=False)
class Shape:
    types: frozenset[str] = frozenset()  # empty: anything goes
    properties: dict[str, Shape] = field(default_factory=dict)
    spellings: dict[str, str] = field(default_factory=dict)  # spelling key -> property
    additional: bool = True
    camel_case: bool = False  # declared names look camelCase: the snake->camel heuristic applies
    defaults: dict[str, Any] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    items: Shape | None = None
    item_schema: dict[str, Any] | None = None  # raw, for lenient arrays
    enum: tuple[Any, ...] | None = None
    enum_folded: dict[str, str] = field(default_factory=dict)  # casefold -> declared
    enum_texts: frozenset[str] = frozenset()  # the enum's strings, for one set lookup
    # The Python types of values normalization leaves as they are here (an enum aside):
    # what `settled` checks a call against.
    kept: frozenset[type] = field(default_factory=lambda: frozenset(_JSON_TYPE_OF))
    kept_scalars: frozenset[type] = field(default_factory=lambda: _SCALARS)  # nothing to walk

    @property
    def is_object(self) -> bool:
        return bool(self.properties) or "object" in self.types

    def accepts(self, json_type: str) -> bool:
        if not self.types:
            return True
        return json_type in self.types or (json_type == "integer" and "number" in self.types)


_JSON_TYPE_OF: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}

_SCALARS: frozenset[type] = frozenset(_JSON_TYPE_OF) - {dict, list}

ANY = Shape()


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value (bool is not an integer here)."""
    return _JSON_TYPE_OF.get(type(value), "unknown")


class ShapeBuilder:
    def __init__(self, root: dict[str, Any]) -> None:
        self._root = root
        self._by_ref: dict[str, Shape] = {}

    def build(self, schema: Any) -> Shape:
        if not isinstance(schema, dict):
            return ANY
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref, schema)
        shape = Shape()
        self._fill(shape, schema)
        return shape

    def _ref(self, ref: str, schema: dict[str, Any]) -> Shape:
        cached = self._by_ref.get(ref)
        if cached is not None:
            return cached
        target = self._resolve(ref)
        shape = Shape()
        self._by_ref[ref] = shape  # registered before filling: recursion lands here
        if target is not None:
            self._fill(shape, target)
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if siblings:
            self._fill(shape, siblings)
        return shape

    def _resolve(self, ref: str) -> dict[str, Any] | None:
        if not ref.startswith("#"):
            return None  # remote refs are not fetched: that argument is left as it is
        node: Any = self._root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, dict) else None

    def _fill(self, shape: Shape, schema: dict[str, Any]) -> None:  # noqa: PLR0912 -- one branch per keyword
        declared = schema.get("type")
        if isinstance(declared, str):
            shape.types = shape.types | {declared}
        elif isinstance(declared, list):
            shape.types = shape.types | {t for t in declared if isinstance(t, str)}
        if isinstance(schema.get("enum"), list):
            self._enum(shape, tuple(schema["enum"]))
        elif "const" in schema:
            self._enum(shape, (schema["const"],))
        if schema.get("additionalProperties") is False:
            shape.additional = False
        if isinstance(schema.get("required"), list):
            shape.required = shape.required | frozenset(
                r for r in schema["required"] if isinstance(r, str)
            )
        props = schema.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                child = self.build(sub)
                shape.properties[name] = child
                if isinstance(sub, dict) and "default" in sub and sub["default"] is not None:
                    shape.defaults[name] = sub["default"]
        if "items" in schema and isinstance(schema["items"], dict):
            shape.items = self.build(schema["items"])
            shape.item_schema = schema["items"]
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            if isinstance(sub, dict):
                self._merge(shape, self.build(sub))
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list):
                self._alternatives(shape, [self.build(b) for b in branches])
        self._index(shape)

    def _alternatives(self, shape: Shape, branches: list[Shape]) -> None:
        types = shape.types
        for branch in branches:
            types = types | branch.types
        objects = [b for b in branches if b.properties]
        arrays = [b for b in branches if b.items is not None]
        if len(objects) == 1:
            self._merge(shape, objects[0])
        elif objects and _compatible(objects):
            for branch in objects:
                self._merge(shape, branch)
        if len(arrays) == 1 and shape.items is None:
            shape.items, shape.item_schema = arrays[0].items, arrays[0].item_schema
        enums = [b.enum for b in branches if b.enum is not None]
        if len(enums) == 1 and shape.enum is None:
            self._enum(shape, enums[0])
        shape.types = types  # alternatives widen the types; merging must not narrow them

    @staticmethod
    def _merge(shape: Shape, other: Shape) -> None:
        if other.types and shape.types:
            both = shape.types & other.types
            shape.types = both or shape.types
        elif other.types:
            shape.types = other.types
        shape.properties.update(
            {k: v for k, v in other.properties.items() if k not in shape.properties}
        )
        shape.defaults.update({k: v for k, v in other.defaults.items() if k not in shape.defaults})
        shape.required = shape.required | other.required
        shape.additional = shape.additional and other.additional
        if shape.items is None:
            shape.items, shape.item_schema = other.items, other.item_schema
        if shape.enum is None and other.enum is not None:
            shape.enum, shape.enum_folded = other.enum, other.enum_folded
            shape.enum_texts = other.enum_texts

    @staticmethod
    def _enum(shape: Shape, values: tuple[Any, ...]) -> None:
        shape.enum = values
        shape.enum_texts = frozenset(v for v in values if isinstance(v, str))
        folded: dict[str, list[str]] = {}
        for value in values:
            if isinstance(value, str):
                folded.setdefault(value.casefold(), []).append(value)
        # Only unambiguous case-insensitive matches are ever used.
        shape.enum_folded = {k: v[0] for k, v in folded.items() if len(v) == 1}

    @staticmethod
    def _index(shape: Shape) -> None:
        # A value of an accepted type passes `coerce` untouched: no string to parse, no
        # number to print, nothing to wrap (the enum's casing is checked on its own).
        shape.kept = frozenset(t for t, name in _JSON_TYPE_OF.items() if shape.accepts(name))
        shape.kept_scalars = shape.kept & _SCALARS
        seen: dict[str, set[str]] = {}
        for name in shape.properties:
            seen.setdefault(spelling_key(name), set()).add(name)
        # A spelling shared by two properties leads nowhere: never guess.
        shape.spellings = {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}
        names = list(shape.properties)
        shape.camel_case = any(n != n.lower() for n in names) and not any("_" in n for n in names)


def _compatible(objects: list[Shape]) -> bool:
    """Object branches can be merged when no spelling leads to two different properties."""
    seen: dict[str, str] = {}
    for branch in objects:
        for name in branch.properties:
            key = spelling_key(name)
            if seen.setdefault(key, name) != name:
                return False
    return True


def build_shape(schema: dict[str, Any]) -> Shape:
    return ShapeBuilder(schema).build(schema)
