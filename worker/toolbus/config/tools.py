"""Per-tool settings: `[guards]`, `[tools.NAME]` with its parameters, and the one lookup rule
(`for_tool`: `server.tool` first, then the bare name)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Annotated, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
)

from toolbus.wire.broker import BrokerUrl as BrokerUrl  # noqa: PLC0414 -- re-exported: its former home

T = TypeVar("T")

# Control characters other than tab, newline and carriage return have no business in
# tool arguments and are a classic injection vector for downstream shells and logs.
DEFAULT_FORBIDDEN_PATTERN = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"

Coercion = Literal[
    "wrap_array",
    "parse_json",
    "string_to_integer",
    "string_to_number",
    "string_to_boolean",
    "number_to_string",
    "enum_case",
    "default",
]
ALL_COERCIONS: frozenset[str] = frozenset(Coercion.__args__)  # type: ignore[attr-defined]
CoercionName = Coercion | Literal["all"]  # what `skip_coercions` accepts
# `strict`: the parameter-mapping seed's rules on top of the defaults (normalization/strict.py).
GuardPreset = Literal["default", "strict"]


# what a path may never hold (also the path guard's rule)
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def root_form(root: str) -> str:
    """An allowed root as the guard compares it (`/a/b`), or ValueError for the config.

    A root the guard's decoding could never produce (`%`, a backslash, a compatibility
    form) would match nothing, so it is refused instead of silently never matching.
    """
    segments = [s for s in root.split("/") if s not in ("", ".")]
    if (
        not root.startswith("/")
        or ".." in segments
        or unicodedata.normalize("NFKC", root) != root
        or any(unicodedata.category(c) in REFUSED_CATEGORIES or c in "\\%" for c in root)
    ):
        raise ValueError(
            f"allowed root {root!r}: must be an absolute POSIX path, without `..`, `%`, "
            "backslashes, control characters or compatibility forms (NFKC)"
        )
    return "/" + "/".join(segments)


def _compiles(pattern: str | None) -> str | None:
    if pattern:
        try:  # `re.error` is no ValueError: pydantic would let it escape unreported
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"forbidden_pattern {pattern!r}: {error}") from None
    return pattern


ForbiddenPattern = Annotated[str | None, AfterValidator(_compiles)]


class GuardSettings(BaseModel):
    """Input guards; `[guards]` globally, `[tools.NAME.guards]` per tool (unset: inherited)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: GuardPreset | None = Field(
        default=None,
        description="`strict`: the parameter-mapping seed's rules (no `<>{}`, no `..`, "
        "file paths of 255 `[A-Za-z0-9._/-]`); a tool's own preset wins over `[guards]`'.",
    )
    max_string_length: int | None = Field(default=None, ge=1)
    max_array_length: int | None = Field(default=None, ge=0)
    max_depth: int | None = Field(default=None, ge=1)
    max_argument_bytes: int | None = Field(default=None, ge=2)
    forbidden_pattern: ForbiddenPattern = Field(default=None, description="Adds to the default.")


# The one place guard defaults are written; `complete_guards` fills a partial table from it.
DEFAULT_GUARDS = GuardSettings(
    preset="default",
    max_string_length=2000,
    max_array_length=100,
    max_depth=16,
    max_argument_bytes=64 * 1024,
    forbidden_pattern=DEFAULT_FORBIDDEN_PATTERN,
)


def complete_guards(partial: GuardSettings) -> GuardSettings:
    """A `[guards]` table with the defaults for what it does not set."""
    return DEFAULT_GUARDS.model_copy(update=partial.model_dump(exclude_none=True))


class ParameterSettings(BaseModel):
    """One parameter of one tool, under `[tools.NAME.parameters."dotted.path"]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_string_length: int | None = Field(default=None, ge=1)
    max_array_length: int | None = Field(default=None, ge=0)
    forbidden_pattern: ForbiddenPattern = Field(default=None, description="Adds to the tool's.")
    path: bool = Field(default=False, description="A file path (implied by `allowed_roots`).")
    allowed_roots: list[Annotated[str, AfterValidator(root_form)]] = Field(default_factory=list)
    lenient: bool = Field(default=False, description="Drop array items that fail their schema.")


class ToolSettings(BaseModel):
    """Per-tool overrides, under `[tools.NAME]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float | None = Field(default=None, gt=0)
    max_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="The hard cap on a call whose progress extends its deadline "
        "(`extend_on_progress`); unset: the global `max_timeout_s`.",
    )
    max_in_flight: int | None = Field(default=None, ge=1, description="MCP tools: own limit.")
    rename_arguments: bool | None = None
    skip_coercions: list[CoercionName] = Field(default_factory=list)
    model_invocable: bool = True
    idempotent: bool | None = Field(
        default=None,
        description="Safe to run twice for one request: a repeat of a call cut short by a "
        "dead worker runs again instead of answering `in_doubt`. Unset: the MCP tool's "
        "readOnlyHint/idempotentHint annotations decide; local tools are not.",
    )
    task: bool = Field(
        default=False,
        description='Always run its calls as tasks (as if each asked `"task": true`).',
    )
    guards: GuardSettings = Field(default_factory=GuardSettings)
    parameters: dict[str, ParameterSettings] = Field(default_factory=dict)


NO_TOOL_SETTINGS = ToolSettings()


def for_tool(table: Mapping[str, T], name: str, server: str | None = None) -> T | None:
    """A per-tool table's entry for one tool: `server.tool` first, then the bare name.

    The one lookup rule for every table keyed by tool name (`[tools.NAME]`,
    `[argument_maps.NAME]`): with both `lamp` and `devices.lamp` configured, the tool
    `lamp` of server `devices` gets `devices.lamp`, every other `lamp` gets `lamp`.
    """
    if server is not None:
        qualified = table.get(f"{server}.{name}")
        if qualified is not None:
            return qualified
    return table.get(name)


def tool_settings(
    tools: Mapping[str, ToolSettings], name: str, server: str | None = None
) -> ToolSettings:
    """A tool's `[tools.NAME]` entry (see `for_tool`), resolved once when the tool is built."""
    return for_tool(tools, name, server) or NO_TOOL_SETTINGS
