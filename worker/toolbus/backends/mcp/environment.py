"""The environment a stdio MCP server starts with: what its config names, little else.

A server is someone else's program; the worker's environment may hold secrets (broker
passwords, exporter tokens, cloud credentials). A server gets only:

    the basics      PATH, HOME, USER, LOGNAME, SHELL, TERM, TMPDIR, LANG, LANGUAGE,
                    TZ and LC_*, from the worker's own environment
    passed          what the worker hands every server (the non-secret `OTEL_*`
                    settings: `toolbus.observability.sdk.child_environment`)
    configured      its own `env` in `mcpServers`, which wins over both

Anything else, a proxy or a token, reaches a server only if its `env` names it.
"""

from __future__ import annotations

from collections.abc import Mapping

BASICS = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "LANG", "LANGUAGE", "TZ"}
)


def basics(environ: Mapping[str, str]) -> dict[str, str]:
    """The basics present in `environ` (never a shell function, as the mcp SDK skips)."""
    return {
        name: value
        for name, value in environ.items()
        if (name in BASICS or name.startswith("LC_")) and not value.startswith("()")
    }


def server_environment(
    environ: Mapping[str, str], passed: Mapping[str, str], configured: Mapping[str, str]
) -> dict[str, str]:
    """The whole environment of one server's process."""
    return {**basics(environ), **passed, **configured}
