"""The report: every change normalization made to a call, as cheap values.

Entries are plain tuples while a call is processed (they are made per key, so they
must cost next to nothing) and become wire `NormalizationEntry` models once, in the reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from toolbus.wire.contracts import NormalizationEntry

RENAME_RULES = frozenset({"static_map", "snake_to_camel", "camel_to_snake", "spelling"})


class Change(NamedTuple):
    path: str
    from_: str
    to: str
    rule: str


def to_wire(changes: Iterable[Change]) -> list[NormalizationEntry]:
    return [
        NormalizationEntry(path=c.path, **{"from": c.from_}, to=c.to, rule=c.rule) for c in changes
    ]


def describe(changes: list[Change]) -> str:
    """The log form: `{device_name: ...} -> {deviceName: ...}` plus value shaping, no values."""
    renames = [c for c in changes if c.rule in RENAME_RULES]
    shaped = [c for c in changes if c.rule not in RENAME_RULES]
    parts = []
    if renames:
        before = ", ".join(f"{c.path.removeprefix('arguments.')}: ..." for c in renames)
        after = ", ".join(f"{c.to}: ..." for c in renames)
        parts.append(f"{{{before}}} -> {{{after}}}")
    parts += [f"{c.path.removeprefix('arguments.')}: {c.rule}" for c in shaped]
    return "; ".join(parts)
