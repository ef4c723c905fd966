"""Registry: every tool by canonical name, and how any spelling of a name finds it.

A name resolves, in order: the exact canonical name; the name a provider format lists
it under (`toolbus.wire.formats.names`: `server__tool` for `server.tool`, and so on); a
server-qualified name (`server.tool`, `server__tool`, `server/tool`); the alias table
(case-insensitive);
a spelling-insensitive match (case, `_`, `-`, `.`, spaces ignored). Two candidates
are never guessed between: the call gets `unknown_tool` listing them.

Two tools of different origins may share a bare name. It belongs to a local tool
(configured in this process on purpose) before any MCP tool, and among MCP servers to
the one listed first in the configuration; every other stays reachable by its
qualified name (`server.tool`). Each such collision is logged once, as a warning.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolbus.config import NO_TOOL_SETTINGS, ToolSettings
from toolbus.tools.context import CallContext
from toolbus.tools.parameters import Parameters, summarize
from toolbus.tools.shapes import ANY, Shape, build_shape, spelling_key
from toolbus.tools.validate import CompiledSchema
from toolbus.wire.contracts import ToolDefinition, ToolResult
from toolbus.wire.errors import UnknownTool
from toolbus.wire.formats.names import provider_names
from toolbus.wire.report import Change

log = logging.getLogger("toolbus.registry")


class Invoke(Protocol):
    """A backend's entry point for one tool: the arguments as they will run, and the
    running call's context (tools/context.py); the tool's result, or a `ToolbusError`."""

    def __call__(
        self, arguments: dict[str, Any], context: CallContext, /
    ) -> Awaitable[ToolResult]: ...


LOCAL = "local"
NAME_PATTERN = re.compile(r"[A-Za-z0-9_\-./]{1,64}")
_QUALIFIER = re.compile(r"^(?P<server>[^./]+?)(?:\.|__|/)(?P<tool>.+)$")


def sanitize_name(name: str) -> str:
    """A name within the allowed characters and length (stable for the same input)."""
    if NAME_PATTERN.fullmatch(name):
        return name
    clean = re.sub(r"[^A-Za-z0-9_\-./]", "_", name).strip("_") or "tool"
    if len(clean) > 64 or clean != name:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        clean = f"{clean[:55]}_{digest}"
    return clean


@dataclass(slots=True)
class Tool:
    """A tool as the pipeline sees it, whatever backend serves it.

    `invoke` is the backend's bound entry point; `rename_arguments` and `timeout_s` are
    the backend's defaults (MCP tools are respelled, local ones not). `settings` is the
    tool's `[tools.NAME]` entry, resolved once when the tool is built (`config.tool_settings`):
    every stage reads it from here, so no two stages can disagree about it.
    `shape`, `validator` and `parameters` are built here, once, never per call.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    invoke: Invoke
    origin: str = LOCAL
    server: str | None = None
    original_name: str | None = None  # as the server announced it, when sanitized
    rank: int = 0  # configuration order of the server: lower wins a bare-name collision
    rename_arguments: bool = False
    timeout_s: float | None = None
    idempotent_hint: bool = False  # the backend says running it twice does no harm
    settings: ToolSettings = NO_TOOL_SETTINGS
    title: str | None = None  # the MCP server's display name, listed again in the MCP format
    annotations: dict[str, Any] | None = None  # the MCP server's hints, as it sent them
    output_schema: dict[str, Any] | None = None  # MCP `outputSchema`: its structured result's
    execution: dict[str, Any] | None = None  # MCP `execution` (`taskSupport`), as it was sent
    validator: CompiledSchema = field(init=False, repr=False)
    shape: Shape = field(default=ANY, repr=False)
    parameters: Parameters = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.validator = CompiledSchema(self.name, self.input_schema)
        self.shape = build_shape(self.input_schema)
        self.parameters = summarize(self.input_schema, self.shape)

    @property
    def renames_arguments(self) -> bool:
        """May argument keys be respelled? Configuration beats the backend's default."""
        configured = self.settings.rename_arguments
        return self.rename_arguments if configured is None else configured

    @property
    def idempotent(self) -> bool:
        """May a call cut short by a dead worker run again? Configuration beats the hint."""
        configured = self.settings.idempotent
        return self.idempotent_hint if configured is None else configured

    @property
    def model_invocable(self) -> bool:
        return self.settings.model_invocable

    @property
    def qualified_name(self) -> str:
        return f"{self.server}.{self.name}" if self.server else self.name

    def definition(self, shown_name: str) -> ToolDefinition:
        return ToolDefinition(
            name=shown_name,
            description=self.description,
            input_schema=self.input_schema,
            origin=self.origin,
            original_name=self.original_name,
            title=self.title,
            output_schema=self.output_schema,
            annotations=self.annotations,
            execution=self.execution,
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    tool: Tool
    name: str  # the canonical name executed: bare when it owns it, else qualified
    report: tuple[Change, ...] = ()


class Registry:
    def __init__(self, aliases: Mapping[str, str] | None = None) -> None:
        self._tools: dict[str, Tool] = {}  # qualified name -> tool
        self._bare: dict[str, str] = {}  # bare name -> qualified name of its owner
        self._aliases = {k.casefold(): v for k, v in (aliases or {}).items()}
        self._spellings: dict[str, set[str]] = {}
        self._provider: dict[str, str] = {}  # canonical name -> name in provider formats
        self._from_provider: dict[str, str] = {}  # the reverse, where the two differ
        self._collisions: set[tuple[str, str]] = set()  # reported (owner, shadowed) pairs
        self._canonical: dict[str, Resolved] = {}  # each canonical name, resolved once
        self.listeners: list[Callable[[], None]] = []

    # -- changes ------------------------------------------------------------

    def register(self, tool: Tool) -> None:
        self._put(tool)
        self._changed()

    def register_all(self, tools: Iterable[Tool]) -> None:
        for tool in tools:
            self._put(tool)
        self._changed()

    def _put(self, tool: Tool) -> None:
        key = tool.qualified_name
        owner_key = self._bare.get(tool.name)
        owner = self._tools.get(owner_key) if owner_key else None
        self._tools[key] = tool
        if owner is None or owner_key == key:
            if owner is not None and owner.origin != tool.origin:
                log.warning(
                    "tool %s registered twice (%s, then %s): the later one wins",
                    tool.name,
                    owner.origin,
                    tool.origin,
                )
            self._bare[tool.name] = key
        else:  # another tool, of another origin, has this bare name
            first, second = sorted((owner, tool), key=_precedence)
            self._bare[tool.name] = first.qualified_name
            self._report_collision(first, second)

    def _report_collision(self, owner: Tool, shadowed: Tool) -> None:
        """Once per pair: an MCP server re-lists its tools at every reconnect."""
        pair = (owner.qualified_name, shadowed.qualified_name)
        if pair in self._collisions:
            return
        self._collisions.add(pair)
        why = "local tools come first" if owner.server is None else "its server is listed first"
        log.warning(
            "%s and %s both expose a tool %s: the bare name goes to %s (%s); "
            "the other is reached as %s",
            _origin_text(owner),
            _origin_text(shadowed),
            owner.name,
            _origin_text(owner),
            why,
            shadowed.qualified_name,
        )

    def unregister_origin(self, origin: str) -> list[str]:
        gone = self._drop_origin(origin)
        self._changed()
        return gone

    def replace_origin(self, origin: str, tools: Iterable[Tool]) -> tuple[list[str], list[str]]:
        """Swap every tool of one origin at once (a reconnect or `tools/list_changed`).

        Calls in flight keep the `Tool` they resolved; new calls see the new set.
        Returns the names added and removed.
        """
        before = {t.qualified_name for t in self._tools.values() if t.origin == origin}
        self._drop_origin(origin)
        for tool in tools:
            self._put(tool)
        self._changed()
        after = {t.qualified_name for t in self._tools.values() if t.origin == origin}
        return sorted(after - before), sorted(before - after)

    def _drop_origin(self, origin: str) -> list[str]:
        gone = [key for key, tool in self._tools.items() if tool.origin == origin]
        for key in gone:
            del self._tools[key]
        self._bare = {name: key for name, key in self._bare.items() if key in self._tools}
        for key, tool in sorted(self._tools.items(), key=lambda kv: _precedence(kv[1])):
            self._bare.setdefault(tool.name, key)  # a shadowed tool gets its bare name back
        return gone

    def _changed(self) -> None:
        self._spellings = {}
        names = self.names()
        for name in names:
            self._spellings.setdefault(spelling_key(name), set()).add(name)
        # Over every name, not a caller's share: a tool is listed alike to everyone.
        self._provider = provider_names(names)
        self._from_provider = {p: c for c, p in self._provider.items() if p != c}
        self._canonical = {}
        for name in names:
            tool = self._exact(name)
            if tool is not None:
                self._canonical[name] = Resolved(tool, self.shown_name(tool))
        for listener in self.listeners:
            listener()

    # -- lookups --------------------------------------------------------------

    def shown_name(self, tool: Tool) -> str:
        return (
            tool.name if self._bare.get(tool.name) == tool.qualified_name else tool.qualified_name
        )

    def provider_name(self, tool: Tool) -> str:
        """The name provider formats list the tool under; it resolves back to the tool."""
        return self._provider[self.shown_name(tool)]

    def names(self) -> list[str]:
        """Every canonical name: bare names, and qualified ones for shadowed tools."""
        return sorted(self.shown_name(tool) for tool in self._tools.values())

    def tools(self) -> list[Tool]:
        return [self._tools[key] for key in sorted(self._tools)]

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._exact(name) is not None

    def listed(self, allowed: Callable[[Tool], bool] | None = None) -> list[Tool]:
        """The tools a model may be offered (`allowed` ones), by canonical name."""
        return [
            tool
            for tool in sorted(self._tools.values(), key=self.shown_name)
            if tool.model_invocable and (allowed is None or allowed(tool))
        ]

    def definitions(self, allowed: Callable[[Tool], bool] | None = None) -> list[ToolDefinition]:
        return [tool.definition(self.shown_name(tool)) for tool in self.listed(allowed)]

    def alias_targets(self) -> dict[str, str]:
        return dict(self._aliases)

    def _exact(self, name: str) -> Tool | None:
        key = self._bare.get(name)
        if key is not None:
            return self._tools[key]
        canonical = self._from_provider.get(name)
        if canonical is not None:  # before qualified names: what we listed means that tool
            return self._exact(canonical)
        match = _QUALIFIER.match(name)
        if match is not None:
            return self._tools.get(f"{match['server']}.{match['tool']}")
        return None

    def get(self, name: str) -> Tool:
        return self.resolve(name).tool

    def resolve(self, name: str) -> Resolved:
        known = self._canonical.get(name)
        if known is not None:  # the common case: one lookup, no spelling folded
            return known
        tool = self._exact(name)
        if tool is not None:
            return Resolved(tool, self.shown_name(tool))
        alias = self._aliases.get(name.casefold())
        if alias is not None:
            tool = self._exact(alias)
            if tool is not None:
                shown = self.shown_name(tool)
                return Resolved(tool, shown, (_entry(name, shown, "alias"),))
        candidates = sorted(self._spellings.get(spelling_key(name), ()))
        if len(candidates) == 1:
            tool = self._exact(candidates[0])
            assert tool is not None
            return Resolved(tool, candidates[0], (_entry(name, candidates[0], "tool_spelling"),))
        if len(candidates) > 1:
            raise UnknownTool(
                f"{name!r} could mean {', '.join(candidates)}: use one of them",
                candidates=candidates,
                ambiguous=True,
            )
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownTool(f"no tool named {name!r}{hint}", candidates=close)

    def unknown_aliases(self) -> dict[str, str]:
        """Alias entries whose target resolves to no tool (reported at start-up)."""
        return {a: t for a, t in self._aliases.items() if self._exact(t) is None}


def _precedence(tool: Tool) -> tuple[bool, int]:
    """Who owns a shared bare name: local tools, then MCP servers in configuration order."""
    return (tool.server is not None, tool.rank)


def _origin_text(tool: Tool) -> str:
    return "the local tools" if tool.server is None else f"MCP server {tool.server}"


def _entry(from_: str, to: str, rule: str) -> Change:
    return Change("tool", from_, to, rule)
