"""Normalize: rewrite argument keys to the spelling the tool's schema declares.

Seed rules, in order, for tools that allow renaming (MCP tools by default):
1. `static_map`: the configured per-tool map (`argument_maps.{tool}`) wins;
2. `snake_to_camel`: a key the schema does not declare whose camelCase form it does;
3. anything else passes unchanged, for validation to judge.
Values are never touched. Two keys landing on one property are refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from worker.contracts import NormalizationEntry
from worker.errors import InvalidArguments
from worker.registry import Tool

log = logging.getLogger("toolbus.normalize")


def snake_to_camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest if part)


class Normalizer:
    def __init__(self, argument_maps: Mapping[str, Mapping[str, str]]) -> None:
        self._maps = {tool: dict(mapping) for tool, mapping in argument_maps.items()}

    def arguments(
        self, tool: Tool, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], list[NormalizationEntry]]:
        if not tool.rename_arguments or not arguments:
            return arguments, []
        static = self._maps.get(tool.name, {})
        out: dict[str, Any] = {}
        sources: dict[str, str] = {}
        entries: list[NormalizationEntry] = []
        for key, value in arguments.items():
            target, rule = self._target(tool, static, key)
            if target in sources:
                raise InvalidArguments(
                    f"arguments {sources[target]!r} and {key!r} both mean {target!r}",
                    conflict=[sources[target], key],
                    property=target,
                )
            sources[target] = key
            out[target] = value
            if rule is not None:
                entries.append(
                    NormalizationEntry(
                        path=f"arguments.{key}", **{"from": key}, to=target, rule=rule
                    )
                )
        if entries:
            log.info(
                "normalized %s: {%s} -> {%s}",
                tool.name,
                ", ".join(f"{e.from_}: ..." for e in entries),
                ", ".join(f"{e.to}: ..." for e in entries),
            )
        return out, entries

    @staticmethod
    def _target(tool: Tool, static: dict[str, str], key: str) -> tuple[str, str | None]:
        if key in static:
            return static[key], "static_map"
        if key in tool.properties or "_" not in key:
            return key, None
        camel = snake_to_camel(key)
        if camel in tool.properties:
            return camel, "snake_to_camel"
        return key, None
