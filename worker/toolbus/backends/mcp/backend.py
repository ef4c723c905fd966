"""The MCP backend: every configured server, started together, stopped together.

`async with McpBackend(...)` starts each server's task in the background (the worker
never waits on them to serve the tools it already has) and stops them on exit, each
within its deadline. Listeners hear every server state change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Self

from opentelemetry import trace

from toolbus.backends.mcp.retry import CLOSE_DEADLINE_S
from toolbus.config import McpPolicy, McpServerConfig, ToolSettings
from toolbus.tools.registry import Registry

if TYPE_CHECKING:
    from toolbus.backends.mcp.server import McpServer, StateListener


class McpBackend:
    """All configured MCP servers; `async with` starts them, exit stops them.

    Args:
        configs: `mcpServers`, in configuration order (the first listed owns a shared name).
        registry: where the servers' tools are registered.
        tool_settings: `[tools.NAME]`, resolved for each tool as it is listed.
        policy: `[mcp]`: start-up attempts, recovery backoff, health checks, limits.
        child_env: environment for stdio servers (e.g. `OTEL_*`); a server's own env wins.
        listeners: called with a server on each change of its state.
        retry_missing_command: False for a one-shot look (`toolbus mappings`): a server
            whose command does not exist is `down` at its first attempt, not its last.
        tracer: the worker's, for each call's CLIENT span (the process-wide one by default).
    """

    def __init__(
        self,
        configs: Mapping[str, McpServerConfig],
        registry: Registry,
        tool_settings: Mapping[str, ToolSettings],
        policy: McpPolicy | None = None,
        *,
        child_env: Mapping[str, str] | None = None,
        listeners: Sequence[StateListener] = (),
        retry_missing_command: bool = True,
        tracer: trace.Tracer | None = None,
    ) -> None:
        policy = policy or McpPolicy()
        self.listeners = list(listeners)
        # The mcp SDK takes about a second to import: a worker with no MCP server (or
        # `toolbus mappings` of local tools) starts without it.
        if any(not cfg.disabled for cfg in configs.values()):
            from toolbus.backends.mcp.server import McpServer  # noqa: PLC0415 -- see above
        self.servers: dict[str, McpServer] = {
            name: McpServer(
                name,
                cfg,
                policy,
                registry=registry,
                tool_settings=tool_settings,
                on_state=self._state_changed,
                rank=rank,
                child_env=child_env,
                retry_missing_command=retry_missing_command,
                tracer=tracer,
            )
            for rank, (name, cfg) in enumerate(configs.items())
            if not cfg.disabled
        }
        self._tasks: list[asyncio.Task[None]] = []

    def _state_changed(self, server: McpServer) -> None:
        for listener in self.listeners:
            listener(server)

    async def __aenter__(self) -> Self:
        for server in self.servers.values():
            self._tasks.append(asyncio.create_task(server.serve(), name=f"mcp:{server.name}"))
        return self

    async def wait_settled(self) -> None:
        """Until every server is ready or has exhausted its start-up attempts."""
        await asyncio.gather(*(s.wait_settled() for s in self.servers.values()))

    def unsettled(self) -> list[str]:
        return [name for name, server in self.servers.items() if not server.settled]

    def states(self) -> dict[str, str]:
        return {name: server.state for name, server in self.servers.items()}

    def partial_lines(self) -> dict[str, int]:
        """Unfinished stdout lines dropped so far, by server."""
        return {name: server.partial_stdout_lines for name, server in self.servers.items()}

    close_bound_s = CLOSE_DEADLINE_S * 3
    """The longest `__aexit__` takes: servers close together, stragglers are cancelled."""

    async def __aexit__(self, *exc: object) -> None:
        for server in self.servers.values():
            server.stop()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=CLOSE_DEADLINE_S * 2)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_DEADLINE_S)
