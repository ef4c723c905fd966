"""Limits: the guard limits in force at each level of a tool's arguments, built once.

`[guards]` sets them for every tool (the defaults fill what it leaves out, and its
`preset` may add the `strict` rules), `[tools.NAME.guards]` narrows them for one tool
(its own `preset` replacing the global one), and `[tools.NAME.parameters."dotted.path"]`
for one parameter and everything below it; the most specific value wins. Forbidden
patterns add up instead: the control-character default, then each level's own, so no
level can lift a ban made above it (only `[guards] forbidden_pattern = ""` lifts the
default). Each tool's parameter tree carries the limits of every node, computed when the
tool is first called, so no call narrows anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from toolbus.config import (
    DEFAULT_FORBIDDEN_PATTERN,
    GuardSettings,
    ParameterSettings,
    complete_guards,
)
from toolbus.normalization.strict import PATTERNS as STRICT_PATTERNS


@dataclass(frozen=True, slots=True)
class Limits:
    max_string_length: int
    max_array_length: int
    max_depth: int
    max_argument_bytes: int
    forbidden: tuple[re.Pattern[str], ...]
    strict: bool = False  # the `strict` preset: its patterns are in `forbidden`; file paths
    # What a string is searched with first: the patterns as one, when they combine
    # safely. A miss there clears the text; a hit is looked up pattern by pattern.
    screen: tuple[re.Pattern[str], ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "screen", _screen(self.forbidden))

    def narrowed(self, override: GuardSettings | ParameterSettings) -> Limits:
        pattern = override.forbidden_pattern
        forbidden = self.forbidden
        if pattern and all(p.pattern != pattern for p in forbidden):
            forbidden = (*forbidden, re.compile(pattern))
        max_depth = max_argument_bytes = None  # a parameter sets neither: only a tool does
        if isinstance(override, GuardSettings):
            max_depth, max_argument_bytes = override.max_depth, override.max_argument_bytes
        return Limits(
            max_string_length=override.max_string_length or self.max_string_length,
            max_array_length=(
                self.max_array_length
                if override.max_array_length is None
                else override.max_array_length
            ),
            max_depth=max_depth or self.max_depth,
            max_argument_bytes=max_argument_bytes or self.max_argument_bytes,
            forbidden=forbidden,
            strict=self.strict,
        )

    def clean(self, text: str) -> bool:
        """No forbidden pattern occurs in `text`."""
        for pattern in self.screen:  # noqa: SIM110 -- a loop: all() adds a generator per string
            if pattern.search(text) is not None:
                return False
        return True


@dataclass
class ParamNode:
    """One level of a tool's `[tools.NAME.parameters]` tree, with the limits in force
    there (the tool's, narrowed by every setting on the way down), computed once."""

    limits: Limits
    settings: ParameterSettings | None = None
    children: dict[str, ParamNode] = field(default_factory=dict)
    special: bool = False  # values may be changed here (path guard, lenient), not only judged


def global_limits(settings: GuardSettings) -> Limits:
    """The `[guards]` table, completed with the defaults."""
    complete = complete_guards(settings)
    forbidden = _global_forbidden(complete.forbidden_pattern)
    strict = complete.preset == "strict"
    if strict:  # after `[guards]`' own, before a tool's: a refusal names the first that matches
        forbidden = (*forbidden, *STRICT_PATTERNS)
    return Limits(
        max_string_length=_limit(complete.max_string_length),
        max_array_length=_limit(complete.max_array_length),
        max_depth=_limit(complete.max_depth),
        max_argument_bytes=_limit(complete.max_argument_bytes),
        forbidden=forbidden,
        strict=strict,
    )


def parameter_tree(limits: Limits, parameters: Mapping[str, ParameterSettings]) -> ParamNode:
    """A tool's `parameters` table as a tree by dotted path, each node with its limits."""
    root = ParamNode(limits)
    for dotted, settings in parameters.items():
        node = root
        for part in dotted.split("."):
            node = node.children.setdefault(part, ParamNode(node.limits))
        node.settings = settings
    _narrow(root, limits)
    return root


def plain(text: str, limits: Limits) -> bool:
    """A string within its limits, as the guards judge it where no parameter is set."""
    if len(text) > limits.max_string_length:
        return False
    for pattern in limits.screen:  # noqa: SIM110 -- a loop: all() adds a generator per string
        if pattern.search(text) is not None:
            return False
    return True


def _narrow(node: ParamNode, limits: Limits) -> None:
    """Each node's limits: those above it, narrowed by its own settings."""
    settings = node.settings
    node.limits = limits if settings is None else limits.narrowed(settings)
    node.special = settings is not None and bool(
        settings.path or settings.allowed_roots or settings.lenient
    )
    for child in node.children.values():
        _narrow(child, node.limits)


def _screen(forbidden: tuple[re.Pattern[str], ...]) -> tuple[re.Pattern[str], ...]:
    """The patterns as one alternation when that means the same: none has groups (a
    backreference would count them anew) or flags of its own; else as they are."""
    if len(forbidden) < 2 or any(p.groups or p.flags & ~re.UNICODE for p in forbidden):
        return forbidden
    try:
        return (re.compile("|".join(f"(?:{p.pattern})" for p in forbidden)),)
    except re.error:
        return forbidden


def _global_forbidden(pattern: str | None) -> tuple[re.Pattern[str], ...]:
    """The `[guards]` pattern adds to the default; only an empty one (`""`) lifts it."""
    if not pattern:
        return ()
    if pattern == DEFAULT_FORBIDDEN_PATTERN:
        return (re.compile(pattern),)
    return re.compile(DEFAULT_FORBIDDEN_PATTERN), re.compile(pattern)


def _limit(value: int | None) -> int:
    if value is None:  # complete_guards sets every limit; a new field without a default would not
        raise ValueError("a global guard limit has no default in DEFAULT_GUARDS")
    return value
