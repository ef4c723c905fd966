"""Registry: every tool the worker can run, local or MCP, by canonical name."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jsonschema.protocols import Validator

from worker.contracts import ToolDefinition, ToolResult
from worker.errors import UnknownTool
from worker.validate import compile_validator

log = logging.getLogger("toolbus.registry")

Invoke = Callable[[dict[str, Any]], Awaitable[ToolResult]]

LOCAL = "local"


@dataclass(slots=True)
class Tool:
    """A tool as the pipeline sees it, whatever backend serves it.

    `invoke` is the backend's bound entry point; `rename_arguments` says whether
    argument keys may be rewritten to the schema's spelling (MCP tools yes, local no).
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    invoke: Invoke
    origin: str = LOCAL
    rename_arguments: bool = False
    timeout_s: float | None = None
    validator: Validator | None = field(default=None, repr=False)
    properties: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # Precomputed once: calls only look things up.
        self.validator = compile_validator(self.name, self.input_schema)
        props = self.input_schema.get("properties")
        self.properties = frozenset(props) if isinstance(props, dict) else frozenset()

    @property
    def accepts_additional(self) -> bool:
        return self.input_schema.get("additionalProperties", True) is not False

    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            origin=self.origin,
        )


class Registry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> None:
        previous = self._tools.get(tool.name)
        if previous is not None:
            log.warning(
                "tool %s registered twice (%s, then %s): the later one wins",
                tool.name,
                previous.origin,
                tool.origin,
            )
        self._tools[tool.name] = tool

    def register_all(self, tools: Iterable[Tool]) -> None:
        for tool in tools:
            self.register(tool)

    def unregister_origin(self, origin: str) -> list[str]:
        gone = [name for name, tool in self._tools.items() if tool.origin == origin]
        for name in gone:
            del self._tools[name]
        return gone

    def get(self, name: str) -> Tool:
        tool = self._tools.get(name)
        if tool is None:
            candidates = difflib.get_close_matches(name, list(self._tools), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(candidates)}?" if candidates else ""
            raise UnknownTool(f"no tool named {name!r}{hint}", candidates=candidates)
        return tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def definitions(self) -> list[ToolDefinition]:
        return [self._tools[name].definition() for name in self.names()]
