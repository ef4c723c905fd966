"""Guards: input limits checked around normalization, before schema validation.

Before normalization (cheap, on whatever arrived): total argument size and nesting
depth. After it, walking the arguments with the tool's shapes: string length,
forbidden-character patterns, the path guard for parameters marked as paths (which
hands the tool the canonical path, reported as `path_canonical`; see `paths`), array
length, and lenient arrays whose invalid items are dropped and reported. A key the
tool's schema does not declare at its level (the caller's choice, not the tool's) is
judged as a string value is (length, patterns), as the tool receives it: after renaming,
so an object parsed from a JSON string has its keys judged too. The `strict` preset adds
the seed's rules (see `strict`). The limits in
force at each level come from `limits`. Every violation is collected; a refusal is
`invalid_arguments` with `details.violations`. Values no guard changed are passed on as
they are: an object or array is copied only when something in it changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jsonschema.protocols import Validator

from toolbus.config import GuardSettings, ParameterSettings
from toolbus.normalization import paths, strict
from toolbus.normalization.limits import Limits, ParamNode, global_limits, parameter_tree, plain
from toolbus.tools.registry import Tool
from toolbus.tools.shapes import ANY, Shape
from toolbus.tools.validate import standalone_check
from toolbus.wire.errors import InvalidArguments
from toolbus.wire.report import Change

MAX_VIOLATIONS = 20
_NO_CHILDREN: dict[str, ParamNode] = {}


@dataclass
class ToolGuards:
    limits: Limits
    params: ParamNode
    item_validators: dict[int, Validator] = field(default_factory=dict)
    item_checks: dict[int, Any] = field(default_factory=dict)  # jsonschema-rs, where it can


class Guards:
    """Input guards: the global `[guards]` limits, narrowed by each tool's own settings."""

    def __init__(self, global_settings: GuardSettings) -> None:
        self._settings = global_settings
        self._global = global_limits(global_settings)
        self._cache: dict[int, tuple[Tool, ToolGuards]] = {}

    def clear(self) -> None:
        """The registry changed: rebuild per-tool tables on next use."""
        self._cache.clear()

    def table(self, tool: Tool) -> ToolGuards:
        """The tool's limits and parameter tree, built on its first call."""
        cached = self._cache.get(id(tool))
        if cached is not None and cached[0] is tool:
            return cached[1]
        own = tool.settings.guards
        base = self._global
        if own.preset is not None and own.preset != self._settings.preset:
            # A tool's preset replaces the global one (strict for one tool, or not for one).
            base = global_limits(self._settings.model_copy(update={"preset": own.preset}))
        limits = base.narrowed(own)
        built = ToolGuards(limits, parameter_tree(limits, tool.settings.parameters))
        self._cache[id(tool)] = (tool, built)
        return built

    def check_envelope(self, tool: Tool, arguments: dict[str, Any], payload_bytes: int = 0) -> None:
        """Size and depth of what arrived, before any work is spent on it.

        The arguments are part of the message, so a message within the limit needs
        no measuring of its own.
        """
        limits = self.table(tool).limits
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
        guards = self.table(tool)
        walk = _Walk(guards, tool)
        checked = walk.value(arguments, tool.shape, guards.params, guards.limits, "arguments")
        _refuse(tool, walk.violations)
        return checked, walk.report


class _Walk:
    def __init__(self, guards: ToolGuards, tool: Tool) -> None:
        self.guards = guards
        self.tool = tool
        self.violations: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str, Any]] = set()
        self.report: list[Change] = []

    def refuse(self, path: str, rule: str, **facts: Any) -> None:
        # One string, one rule, one violation (`..` both as a path and as text); a set, as
        # an array of thousands of bad items makes thousands of violations.
        seen = (path, rule, facts.get("key"))
        if seen in self._seen:
            return
        self._seen.add(seen)
        self.violations.append({"path": path, "rule": rule, **facts})

    def value(  # noqa: PLR0917 -- the walk's state, passed down as the other methods do
        self,
        value: Any,
        shape: Shape,
        param: ParamNode | None,
        limits: Limits,
        path: str,
        named_path: bool = False,
    ) -> Any:
        """The value as the tool receives it: the same object unless a guard changed it.
        `named_path`: under `strict`, a value of a `file`/`files` field (a file path)."""
        settings = None
        if param is not None:
            settings = param.settings
            limits = param.limits
        if isinstance(value, str):
            return self.string(value, settings, limits, path, named_path)
        if isinstance(value, list):
            return self.array(value, shape, param, settings, limits, path, named_path)
        if isinstance(value, dict):
            children = param.children if param is not None else _NO_CHILDREN
            properties = shape.properties
            changed: dict[str, Any] | None = None
            for index, (k, v) in enumerate(value.items()):
                if k not in properties and not plain(k, limits):
                    self.key(k, index, limits, path)  # a key the schema does not name
                named = limits.strict and k in strict.PATH_NAMES
                if type(v) is str and not named and k not in children and plain(v, limits):
                    continue  # the common string: nothing to refuse, change or report
                checked = self.value(
                    v, properties.get(k, ANY), children.get(k), limits, f"{path}.{k}", named
                )
                if checked is not v:
                    if changed is None:
                        changed = dict(value)  # copied at the first change, in key order
                    changed[k] = checked
            return value if changed is None else changed
        return value

    def key(self, key: str, index: int, limits: Limits, path: str) -> None:
        """A key is judged as a string value is; the violation names the object that holds
        it and the key's place there (`key`, from 0), not the key itself."""
        if len(key) > limits.max_string_length:
            self.refuse(
                path,
                "max_string_length",
                key=index,
                limit=limits.max_string_length,
                actual=len(key),
            )
        self.forbidden([key], limits, path, key=index)

    def string(
        self,
        text: str,
        settings: ParameterSettings | None,
        limits: Limits,
        path: str,
        named_path: bool = False,
    ) -> str:
        if len(text) > limits.max_string_length:
            self.refuse(path, "max_string_length", limit=limits.max_string_length, actual=len(text))
        checked = [text]
        marked = False  # a parameter marked as a path
        if settings is not None and (settings.path or settings.allowed_roots):
            marked = True
            text = self.file_path(text, settings, path)
            if text != checked[0]:
                checked.append(text)  # the patterns hold for what the tool receives too
        self.forbidden(checked, limits, path)
        if limits.strict and (named_path or marked):
            for each in checked:
                for rule, facts in strict.path_violations(each):
                    self.refuse(path, rule, **facts)
        return text

    def forbidden(self, texts: list[str], limits: Limits, path: str, **where: Any) -> None:
        for text in texts:
            if limits.clean(text):
                continue
            for pattern in limits.forbidden:
                found = pattern.search(text)
                if found is not None:
                    rule, reason = strict.RULES.get(pattern.pattern, ("forbidden_characters", ""))
                    facts: dict[str, Any] = {"reason": reason} if reason else {}
                    self.refuse(
                        path,
                        rule,
                        **where,
                        **facts,
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
        param: ParamNode | None,
        settings: ParameterSettings | None,
        limits: Limits,
        path: str,
        named_path: bool = False,
    ) -> list[Any]:
        if len(items) > limits.max_array_length:
            self.refuse(path, "max_array_length", limit=limits.max_array_length, actual=len(items))
        kept = items
        if settings is not None and settings.lenient and shape.item_schema is not None:
            kept = self.lenient(items, shape, path)
        item_shape = shape.items or ANY
        unguarded = not named_path and (
            settings is None or not (settings.path or settings.allowed_roots)
        )
        checked = [
            item  # as in objects: a plain string within its limits needs no call
            if unguarded and type(item) is str and plain(item, limits)
            else self.value(item, item_shape, param, limits, f"{path}[{i}]", named_path)
            for i, item in enumerate(kept)
        ]
        if kept is items and all(new is old for new, old in zip(checked, items, strict=True)):
            return items
        return checked

    def lenient(self, items: list[Any], shape: Shape, path: str) -> list[Any]:
        validator = self._item_validator(shape)
        if validator is None:
            return items
        check = self.guards.item_checks.get(id(shape))  # filled with the validator
        kept = []
        for i, item in enumerate(items):
            if check is not None and check.is_valid(item):
                kept.append(item)  # valid: no need to ask the slower validator why not
                continue
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
            self.guards.item_checks[id(shape)] = standalone_check(
                shape.item_schema, self.tool.input_schema
            )
        return cache[id(shape)]


def _depth(value: Any) -> int:
    """How deeply objects and arrays nest (the arguments object alone: 1), level by level."""
    depth = 0
    level = [value] if isinstance(value, (dict, list)) else []
    while level:
        depth += 1
        below: list[Any] = []
        for node in level:
            below.extend(
                child
                for child in (node.values() if isinstance(node, dict) else node)
                if isinstance(child, (dict, list))
            )
        level = below
    return depth


def _refuse(tool: Tool, violations: list[dict[str, Any]]) -> None:
    if violations:
        raise InvalidArguments(
            f"arguments for {tool.name} break {len(violations)} input guard(s): "
            # The seed's words where it has some (`strict.WORDS`), else the rule.
            + "; ".join(
                f"{v['path']}: {strict.WORDS.get(v.get('reason', ''), v['rule'])}"
                for v in violations[:3]
            ),
            violations=violations[:MAX_VIOLATIONS],
        )
