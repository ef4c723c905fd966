"""Settled: arguments that normalization would leave as they are and no guard would stop.

Most calls arrive as the schema asks: its own keys, values of the declared types, short
strings. For those, the full path (`Guards.check_envelope`, `Normalizer.arguments`,
`Guards.check_values`) would copy every object only to hand back the same values with
an empty report. One walk recognises them instead, with each tool's plan (its shapes,
static map, guard limits and parameter tree), built on its first call and kept until
the registry changes.

The walk only ever answers "settled" or "not sure": a key to respell, a value to shape,
a default to fill, a path or lenient parameter, a limit reached, anything but plain JSON.
"Not sure" sends the call down the full path, which alone decides, refuses and reports.
So the walk can be too cautious but never too lenient; schema validation runs either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolbus.normalization.guards import Guards
from toolbus.normalization.limits import Limits, ParamNode
from toolbus.normalization.normalize import EMPTY_MAP, Normalizer, StaticMap
from toolbus.normalization.shapes import ANY, Shape
from toolbus.registry import Tool

# Deeper than this the walk steps aside, whatever `max_depth` allows: it recurses.
MAX_WALK_DEPTH = 32


@dataclass(frozen=True, slots=True)
class Plan:
    """One tool's view of a settled call, from its shapes, rules and guards."""

    shape: Shape
    static: StaticMap
    params: ParamNode
    fills_defaults: bool  # missing properties with a default would be filled
    max_depth: int
    max_argument_bytes: int

    def settled(self, arguments: dict[str, Any], payload_bytes: int) -> bool:
        """True when the full path would pass `arguments` on unchanged, with no report."""
        # A message within the size limit holds arguments within it (`check_envelope`).
        if not 0 < payload_bytes <= self.max_argument_bytes:
            return False
        return self._object(arguments, self.shape, self.static, self.params, self.params.limits, 1)

    def _value(  # noqa: PLR0911, PLR0917 -- one return per finding; the walk's state
        self,
        value: Any,
        shape: Shape,
        static: StaticMap,
        param: ParamNode | None,
        limits: Limits,
        depth: int,
    ) -> bool:
        kind = type(value)
        if kind not in shape.kept:
            return False  # a value to shape (or not JSON at all)
        if param is not None:
            if param.special:
                return False
            limits = param.limits
        if kind is str:
            if shape.enum is not None and value not in shape.enum_texts:
                return False  # maybe a casing of a declared value
            if len(value) > limits.max_string_length:
                return False
            for pattern in limits.screen:  # noqa: SIM110 -- `Limits.clean` inlined: no call per string
                if pattern.search(value) is not None:
                    return False
            return True
        if kind is dict:
            return self._object(value, shape, static, param, limits, depth + 1)
        if kind is list:
            if depth + 1 > self.max_depth or depth >= MAX_WALK_DEPTH:
                return False
            if len(value) > limits.max_array_length:
                return False
            items = shape.items or ANY
            return all(self._value(v, items, static, param, limits, depth + 1) for v in value)
        return True  # a number, a boolean or null the shape accepts

    def _object(  # noqa: PLR0917 -- the walk's state, as `_value` takes it
        self,
        value: dict[str, Any],
        shape: Shape,
        static: StaticMap,
        param: ParamNode | None,
        limits: Limits,
        depth: int,
    ) -> bool:
        if depth > self.max_depth or depth > MAX_WALK_DEPTH:
            return False
        properties = shape.properties
        # Normalization walks this object only where the schema or static map describes it.
        walked = bool(properties) or not static.empty
        if walked and self.fills_defaults and any(name not in value for name in shape.defaults):
            return False  # a default to fill
        statics = static.children
        children = param.children if param is not None else None
        for key, item in value.items():
            child = properties.get(key)
            if child is None:
                if walked:
                    return False  # a key to respell, or one validation will judge
                child = ANY
            if not self._value(
                item,
                child,
                statics.get(key, EMPTY_MAP) if statics else EMPTY_MAP,
                children.get(key) if children else None,
                limits,
                depth,
            ):
                return False
        return True


class Plans:
    """Each tool's `Plan`, built on its first call and kept until the registry changes."""

    def __init__(self, normalizer: Normalizer, guards: Guards) -> None:
        self._normalizer = normalizer
        self._guards = guards
        self._cache: dict[int, tuple[Tool, Plan]] = {}

    def clear(self) -> None:
        """The registry changed: rebuild per-tool plans on next use."""
        self._cache.clear()

    def settled(self, tool: Tool, arguments: dict[str, Any], payload_bytes: int) -> bool:
        cached = self._cache.get(id(tool))
        plan = cached[1] if cached is not None and cached[0] is tool else self._build(tool)
        return plan.settled(arguments, payload_bytes)

    def _build(self, tool: Tool) -> Plan:
        rules = self._normalizer.rules(tool)
        table = self._guards.table(tool)
        plan = Plan(
            shape=tool.shape,
            static=rules.static,
            params=table.params,
            fills_defaults="default" in rules.coercions,
            max_depth=table.limits.max_depth,
            max_argument_bytes=table.limits.max_argument_bytes,
        )
        self._cache[id(tool)] = (tool, plan)
        return plan
