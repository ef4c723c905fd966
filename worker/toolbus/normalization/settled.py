"""Settled: arguments that need at most their top-level keys respelled, and trip no guard.

Most calls arrive as the schema asks: its own keys (or a spelling of them a static map
or the respelling rules resolve), values of the declared types, short strings. For
those, the full path (`Guards.check_envelope`, `Normalizer.arguments`,
`Guards.check_values`) would copy every object only to hand back the same values with,
at most, a few renamed keys. One walk recognises them instead, with each tool's plan
(its shapes, static map, guard limits and parameter tree), built on its first call and
kept until the registry changes; a respelled key is resolved by normalization's own
rule (`key_target`) and remembered.

The walk only ever answers "settled" or "not sure": a key kept or respelled below the top,
two keys for one property, a value to shape, a default to fill, a path or lenient
parameter (under `strict`, a `file` or `files` field too), a limit reached by a value or a
key, anything but plain JSON. "Not sure" sends the call down the
full path, which alone decides, refuses and reports. So the walk can be too cautious but
never too lenient; schema validation runs either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolbus.normalization.guards import Guards
from toolbus.normalization.limits import Limits, ParamNode, plain
from toolbus.normalization.normalize import EMPTY_MAP, Normalizer, StaticMap, key_target
from toolbus.normalization.strict import PATH_NAMES
from toolbus.tools.registry import Tool
from toolbus.tools.shapes import ANY, Shape
from toolbus.wire.report import Change

# Deeper than this the walk steps aside, whatever `max_depth` allows: it recurses.
MAX_WALK_DEPTH = 32
# Respelled keys remembered per tool; a caller choosing keys cannot grow it further.
MAX_REMEMBERED_KEYS = 256


@dataclass(frozen=True, slots=True)
class Plan:
    """One tool's view of a settled call, from its shapes, rules and guards."""

    shape: Shape
    static: StaticMap
    params: ParamNode
    rename: bool  # the tool's keys may be respelled (not only mapped)
    fills_defaults: bool  # missing properties with a default would be filled
    max_depth: int
    max_argument_bytes: int
    targets: dict[str, tuple[str, Change] | None] = field(default_factory=dict)  # remembered

    def settled(  # noqa: PLR0911 -- one return per reason to step aside
        self, arguments: dict[str, Any], payload_bytes: int
    ) -> tuple[dict[str, Any], list[Change]] | None:
        """What the full path would make of `arguments` and its report, if it would change
        nothing but top-level keys; None when the full path must decide."""
        # A message within the size limit holds arguments within it (`check_envelope`).
        if not 0 < payload_bytes <= self.max_argument_bytes:
            return None
        shape, static, params = self.shape, self.static, self.params
        properties = shape.properties
        # The top level is always walked, but only keys it declares or maps can change.
        walked = bool(properties) or not static.empty
        if walked and self.fills_defaults and any(n not in arguments for n in shape.defaults):
            return None  # a default to fill (or given under another spelling)
        statics, children, limits = static.children, params.children, params.limits
        out: dict[str, Any] | None = None  # made at the first respelled key
        renames: list[Change] = []
        for key, item in arguments.items():
            child = properties.get(key)
            target = key
            if child is None:
                if not walked:
                    child = ANY
                else:
                    found = self._target(key)
                    if found is None:
                        return None  # kept for validation to judge, or not a property
                    target, change = found
                    if target in arguments or (out is not None and target in out):
                        return None  # two keys for one property: the full path refuses it
                    child = properties[target]
                    if out is None:
                        out = _before(arguments, key)
                    renames.append(change)
            if not _key_passes(target, walked, limits):
                return None
            if out is not None:
                out[target] = item
            if not self._value(
                item,
                child,
                statics.get(target, EMPTY_MAP) if statics else EMPTY_MAP,
                children.get(target) if children else None,
                limits,
                1,
            ):
                return None
        return (arguments, renames) if out is None else (out, renames)

    def _target(self, key: str) -> tuple[str, Change] | None:
        """The declared property a top-level key is respelled to, as `key_target` finds it,
        and the report entry that says so (the same every time: made once)."""
        if key in self.targets:
            return self.targets[key]
        target, rule = key_target(key, self.shape, self.static, self.rename)
        found = None
        if rule is not None and target in self.shape.properties:
            found = (target, Change(f"arguments.{key}", key, target, rule))
        if len(self.targets) < MAX_REMEMBERED_KEYS:
            self.targets[key] = found
        return found

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
            if not _key_passes(key, walked, limits):
                return False
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


def _key_passes(key: str, declared: bool, limits: Limits) -> bool:
    """A key the guards pass without a word: one the schema declares (the tool's own name)
    or one within the string limits, as a value is judged; under `strict`, not a `file`
    or `files` field (its values are file paths, judged on the full path)."""
    if limits.strict and key in PATH_NAMES:
        return False
    return declared or plain(key, limits)


def _before(arguments: dict[str, Any], key: str) -> dict[str, Any]:
    """The entries before `key`, in order: the start of a copy with keys respelled."""
    out = {}
    for earlier, value in arguments.items():
        if earlier == key:
            break
        out[earlier] = value
    return out


class Plans:
    """Each tool's `Plan`, built on its first call and kept until the registry changes."""

    def __init__(self, normalizer: Normalizer, guards: Guards) -> None:
        self._normalizer = normalizer
        self._guards = guards
        self._cache: dict[int, tuple[Tool, Plan]] = {}

    def clear(self) -> None:
        """The registry changed: rebuild per-tool plans on next use."""
        self._cache.clear()

    def settled(
        self, tool: Tool, arguments: dict[str, Any], payload_bytes: int, report: list[Change]
    ) -> dict[str, Any] | None:
        """The arguments as the full path would pass them on, their renames added to
        `report` (and logged as normalization logs them); None: take the full path."""
        cached = self._cache.get(id(tool))
        plan = cached[1] if cached is not None and cached[0] is tool else self._build(tool)
        settled = plan.settled(arguments, payload_bytes)
        if settled is None:
            return None
        if settled[1]:
            report.extend(settled[1])
            self._normalizer.log_changes(tool, settled[1])
        return settled[0]

    def _build(self, tool: Tool) -> Plan:
        rules = self._normalizer.rules(tool)
        table = self._guards.table(tool)
        plan = Plan(
            shape=tool.shape,
            static=rules.static,
            params=table.params,
            rename=rules.rename,
            fills_defaults="default" in rules.coercions,
            max_depth=table.limits.max_depth,
            max_argument_bytes=table.limits.max_argument_bytes,
        )
        self._cache[id(tool)] = (tool, plan)
        return plan
