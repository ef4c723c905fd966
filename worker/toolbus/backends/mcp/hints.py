"""What to check when an MCP server's start-up attempts are spent: said from what failed.

The seed's words, "check the MQTT broker and MCP server configuration", fit a server that
started and gave up (it may need a broker of its own): that hint adds how it ended. They do
not fit a command that was never found, or a server that never answered: those hints say
what failed instead (the command and the PATH it was looked for on, the working
directory, the handshake's deadline), and never name a broker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypeVar

from toolbus.backends.mcp.environment import server_environment
from toolbus.config import McpServerConfig

E = TypeVar("E", bound=BaseException)

SEED_HINT = "check the MQTT broker and MCP server configuration (mcpServers.{server})"


def startup_hint(
    server: str, config: McpServerConfig, failure: BaseException, child_env: Mapping[str, str]
) -> str:
    """The hint of the `MCP connection failed after N attempts` line."""
    seed = SEED_HINT.format(server=server)
    where = f"mcpServers.{server}"
    missing = _first(failure, FileNotFoundError)
    if config.command is not None and missing is not None:
        return _not_found(where, config, missing, child_env)
    if config.command is not None and _first(failure, PermissionError) is not None:
        return f"the command {config.command!r} may not be run (permission denied): fix {where}"
    if _first(failure, TimeoutError) is not None:
        target = "its url" if config.url else "its command"
        return (
            f"the server did not finish the MCP handshake within connect_timeout_s "
            f"({config.connect_timeout_s:g} s): check that {target} in {where} serves MCP, "
            "or give it longer"
        )
    ended = _first(failure, ConnectionError)
    if config.command is not None and ended is not None and "server process" in str(ended):
        # `the server process exited with code N` / `was killed by signal S`
        # The seed's words first (its acceptance reads them so), then what failed.
        return f"{seed}: {ended} before its session opened; its stderr says why"
    return seed


def _not_found(
    where: str, config: McpServerConfig, missing: FileNotFoundError, child_env: Mapping[str, str]
) -> str:
    """The command, or the working directory, was not there when the server was started."""
    assert config.command is not None
    if config.cwd and missing.filename == config.cwd:
        return f"the working directory {config.cwd} was not found: fix {where}.cwd"
    if os.sep in config.command:
        return f"the command {config.command} was not found: fix {where}.command"
    path = server_environment(os.environ, child_env, config.env).get("PATH", os.defpath)
    return (
        f"the command {config.command!r} was not found on PATH ({path}): install it, add its "
        f"directory to PATH, or give its full path in {where}.command"
    )


def _first(failure: BaseException, kind: type[E]) -> E | None:
    """`failure`, or the first exception of that kind in its groups."""
    if isinstance(failure, kind):
        return failure
    if isinstance(failure, BaseExceptionGroup):
        for inner in failure.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None
