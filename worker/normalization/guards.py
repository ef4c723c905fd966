"""Guards: input limits checked around normalization, before schema validation.

Before normalization (cheap, on whatever arrived): total argument size and nesting
depth. After it, walking the arguments with the tool's shapes: string length,
forbidden-character patterns, the path guard for parameters marked as paths (which
hands the tool the canonical path, reported as `path_canonical`; see `paths`), array
length, and lenient arrays whose invalid items are dropped and reported. Limits come
from `[guards]`, `[tools.NAME.guards]` and `[tools.NAME.parameters."dotted.path"]`,
the most specific winning; forbidden patterns add up instead (the control-character
default, then each level's own), so no level can lift a ban made above it. Every
violation is collected; a refusal is `invalid_arguments` with `details.violations`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema.protocols import Validator

from toolbus.config import (
    DEFAULT_FORBIDDEN_PATTERN,
    GuardSettings,
    ParameterSettings,
    complete_guards,
)
from toolbus.errors import InvalidArguments
from toolbus.normalization import paths
from toolbus.normalization.report import Change
from toolbus.normalization.shapes import ANY, Shape
from toolbus.registry import Tool

MAX_VIOLATIONS = 20


@dataclass(frozen=True, slots=True)
class Limits:
    max_string_length: int
    max_array_length: int
    max_depth: int
    max_argument_bytes: int
    forbidden: tuple[re.Pattern[str], ...]

    def narrowed(self, override: GuardSettings | ParameterSettings) -> Limits:
        pattern = override.forbidden_pattern
        forbidden = self.forbidden
        if pattern and all(p.pattern != pattern for p in forbidden):
            forbidden = (*forbidden, re.compile(pattern))
        return Limits(
            max_string_length=override.max_string_length or self.max_string_length,
            max_array_length=(
                self.max_array_length
                if override.max_array_length is None
                else override.max_array_length
            ),
            max_depth=getattr(override, "max_depth", None) or self.max_depth,
            max_argument_bytes=getattr(override, "max_argument_bytes", None)
            or self.max_argument_bytes,
            forbidden=forbidden,
        )


@dataclass
class _Param:
    settings: ParameterSettings | None = None
    limits: Limits | None = None
    children: dict[str, _Param] = field(default_factory=dict)


@dataclass
class _ToolGuards:
    limits: Limits
    params: _Param
    item_validators: dict[int, Validator] = field(default_factory=dict)


class Guards:
    """Input guards: the global `[guards]` limits, narrowed by each tool's own settings."""

    def __init__(self, global_settings: GuardSettings) -> None:
        complete = complete_guards(global_settings)
        self._global = Limits(
            max_string_length=_limit(complete.max_string_length),
            max_array_length=_limit(complete.max_array_length),
            max_depth=_limit(complete.max_depth),
            max_argument_bytes=_limit(complete.max_argument_bytes),
            forbidden=_global_forbidden(complete.forbidden_pattern),
        )
        self._cache: dict[int, tuple[Tool, _ToolGuards]] = {}

    def clear(self) -> None:
        """The registry changed: rebuild per-tool tables on next use."""
        self._cache.clear()

    def _for(self, tool: Tool) -> _ToolGuards:
        cached = self._cache.get(id(tool))
        if cached is not None and cached[0] is tool:
            return cached[1]
        config = tool.settings
        limits = self._global.narrowed(config.guards)
        root = _Param(limits=limits)
        for dotted, settings in config.parameters.items():
            node = root
            for part in dotted.split("."):
                node = node.children.setdefault(part, _Param())
            node.settings = settings
        built = _ToolGuards(limits, root)
        self._cache[id(tool)] = (tool, built)
        return built

    def check_envelope(self, tool: Tool, arguments: dict[str, Any], payload_bytes: int = 0) -> None:
        """Size and depth of what arrived, before any work is spent on it.

        The arguments are part of the message, so a message within the limit needs
        no measuring of its own.
        """
        limits = self._for(tool).limits
        if 0 < payload_bytes <= limits.max_argument_bytes:
            size = payload_bytes
        else:
            size = len(json.dumps(arguments, ensure_ascii=False).encode())
        violations = []
        if size > limits.max_argument_bytes:
            violations.append(
                {
                    "path": "arguments",
                    "rule": "max_argument_bytes",
                    "limit": limits.max_argument_bytes,
                    "actual": size,
                }
            )
        depth = _depth(arguments)
        if depth > limits.max_depth:
            violations.append(
                {
                    "path": "arguments",
                    "rule": "max_depth",
                    "limit": limits.max_depth,
                    "actual": depth,
                }
            )
        _refuse(tool, violations)

    def check_values(
        self, tool: Tool, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], list[Change]]:
        guards = self._for(tool)
        walk = _Walk(guards, tool)
        checked = walk.value(arguments, tool.shape, guards.params, guards.limits, "arguments")
        _refuse(tool, walk.violations)
        return checked, walk.report


class _Walk:
    def __init__(self, guards: _ToolGuards, tool: Tool) -> None:
        self.guards = guards
        self.tool = tool
        self.violations: list[dict[str, Any]] = []
        self.report: list[Change] = []

    def refuse(self, path: str, rule: str, **facts: Any) -> None:
        self.violations.append({"path": path, "rule": rule, **facts})

    def value(
        self, value: Any, shape: Shape, param: _Param | None, limits: Limits, path: str
    ) -> Any:
        settings = param.settings if param else None
        if settings is not None:
            limits = limits.narrowed(settings)
        if isinstance(value, str):
            value = self.string(value, settings, limits, path)
        elif isinstance(value, list):
            value = self.array(value, shape, param, settings, limits, path)
        elif isinstance(value, dict):
            children = param.children if param else {}
            value = {
                k: self.value(
                    v, shape.properties.get(k, ANY), children.get(k), limits, f"{path}.{k}"
                )
                for k, v in value.items()
            }
        return value

    def string(
        self, text: str, settings: ParameterSettings | None, limits: Limits, path: str
    ) -> str:
        if len(text) > limits.max_string_length:
            self.refuse(path, "max_string_length", limit=limits.max_string_length, actual=len(text))
        checked = [text]
        if settings is not None and (settings.path or settings.allowed_roots):
            text = self.file_path(text, settings, path)
            if text != checked[0]:
                checked.append(text)  # the patterns hold for what the tool receives too
        self.forbidden(checked, limits, path)
        return text

    def forbidden(self, texts: list[str], limits: Limits, path: str) -> None:
        for text in texts:
            for pattern in limits.forbidden:
                found = pattern.search(text)
                if found is not None:
                    self.refuse(
                        path,
                        "forbidden_characters",
                        position=found.start(),
                        pattern=pattern.pattern,
                    )
                    return

    def file_path(self, text: str, settings: ParameterSettings, path: str) -> str:
        verdict = paths.judge(text, settings.allowed_roots)
        if verdict.refusal is not None:
            facts: dict[str, Any] = {
                "reason": verdict.refusal.reason,
                "decoded": list(verdict.decoded),
            }
            if verdict.refusal.rule == paths.OUTSIDE_ROOTS:
                facts["allowed_roots"] = settings.allowed_roots
            self.refuse(path, verdict.refusal.rule, **facts)
            return text
        if verdict.canonical != text:
            # Descriptions, not values: a path may be personal, and the report reaches spans.
            where = "under " + settings.allowed_roots[0] if settings.allowed_roots else "relative"
            self.report.append(Change(path, ", ".join(verdict.decoded), where, "path_canonical"))
        return verdict.canonical

    def array(  # noqa: PLR0917 -- the walk's state, passed down as the other methods do
        self,
        items: list[Any],
        shape: Shape,
        param: _Param | None,
        settings: ParameterSettings | None,
        limits: Limits,
        path: str,
    ) -> list[Any]:
        if len(items) > limits.max_array_length:
            self.refuse(path, "max_array_length", limit=limits.max_array_length, actual=len(items))
        if settings is not None and settings.lenient and shape.item_schema is not None:
            items = self.lenient(items, shape, path)
        item_shape = shape.items or ANY
        return [
            self.value(item, item_shape, param, limits, f"{path}[{i}]")
            for i, item in enumerate(items)
        ]

    def lenient(self, items: list[Any], shape: Shape, path: str) -> list[Any]:
        validator = self._item_validator(shape)
        if validator is None:
            return items
        kept = []
        for i, item in enumerate(items):
            error = next(iter(validator.iter_errors(item)), None)
            if error is None:
                kept.append(item)
            else:
                self.report.append(
                    # The keyword, not the message: messages quote the (maybe personal) value.
                    Change(
                        f"{path}[{i}]", f"invalid ({error.validator})", "(dropped)", "lenient_drop"
                    )
                )
        return kept

    def _item_validator(self, shape: Shape) -> Validator | None:
        cache = self.guards.item_validators
        if id(shape) not in cache:
            root = self.tool.validator.reference
            if root is None or shape.item_schema is None:
                return None
            # evolve keeps the root's resolver: $refs in the item schema still resolve.
            cache[id(shape)] = root.evolve(schema=shape.item_schema)
        return cache[id(shape)]


def _limit(value: int | None) -> int:
    if value is None:  # complete_guards sets every limit; a new field without a default would not
        raise ValueError("a global guard limit has no default in DEFAULT_GUARDS")
    return value


def _global_forbidden(pattern: str | None) -> tuple[re.Pattern[str], ...]:
    """The `[guards]` pattern adds to the default; only an empty one (`""`) lifts it."""
    if not pattern:
        return ()
    if pattern == DEFAULT_FORBIDDEN_PATTERN:
        return (re.compile(pattern),)
    return re.compile(DEFAULT_FORBIDDEN_PATTERN), re.compile(pattern)


def _depth(value: Any) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _refuse(tool: Tool, violations: list[dict[str, Any]]) -> None:
    if violations:
        raise InvalidArguments(
            f"arguments for {tool.name} break {len(violations)} input guard(s): "
            + "; ".join(f"{v['path']}: {v['rule']}" for v in violations[:3]),
            violations=violations[:MAX_VIOLATIONS],
        )
