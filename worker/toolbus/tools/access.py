"""Access: which tools each caller may see and call.

`[callers.NAME] tools = [...]` lists a caller's tools by any name the registry
resolves (aliases, other spellings). A profile named `*` applies to callers without
their own, and lends a caller's profile the `tools` it leaves unset; a request that
names no caller is `anonymous`. With no profile setting `tools`, every tool.
Names are resolved whenever the registry changes; names that resolve to nothing are
reported, never guessed at call time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from toolbus.config.callers import (
    ANONYMOUS_CALLER,
    DEFAULT_CALLER_PROFILE,
    CallerProfile,
    caller_profile,
)
from toolbus.tools.registry import Registry, Tool
from toolbus.wire.errors import UnknownTool

log = logging.getLogger("toolbus.access")


class Access:
    def __init__(self, profiles: Mapping[str, CallerProfile]) -> None:
        self._profiles = dict(profiles)
        self._allowed: dict[str, frozenset[str]] = {}
        self.unknown: dict[str, list[str]] = {}

    @property
    def callers(self) -> list[str]:
        """The configured profiles' names (`*` among them when configured)."""
        return list(self._profiles)

    def refresh(self, registry: Registry) -> None:
        """Each profile's tools (its own, or those `*` lends it) as canonical names."""
        allowed: dict[str, frozenset[str]] = {}
        unknown: dict[str, list[str]] = {}
        for caller, profile in self._profiles.items():
            tools = caller_profile(self._profiles, caller).tools
            if tools is None:
                continue
            names = set()
            for name in tools:
                try:
                    names.add(registry.resolve(name).tool.qualified_name)
                except UnknownTool:
                    if profile.tools is not None:  # reported once, by the profile naming it
                        unknown.setdefault(caller, []).append(name)
            allowed[caller] = frozenset(names)
        self._allowed, self.unknown = allowed, unknown

    def report_unknown(self) -> None:
        for caller, names in self.unknown.items():
            log.warning(
                "caller profile %s lists tools that do not exist: %s", caller, ", ".join(names)
            )

    def allows(self, caller: str | None, tool: Tool) -> bool:
        if not self._allowed:
            return True
        name = caller or ANONYMOUS_CALLER
        # As `caller_profile` looks it up: a caller without a profile of its own is `*`.
        allowed = self._allowed.get(name if name in self._profiles else DEFAULT_CALLER_PROFILE)
        return allowed is None or tool.qualified_name in allowed
