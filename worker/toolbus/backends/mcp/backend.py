"""The MCP backend: every configured server, started together, stopped together.

`async with McpBackend(...)` starts each server's task in the background (the worker
never waits on them to serve the tools it already has) and stops them on exit, each
within its deadline. Listeners hear every server state change.

The servers themselves (`server.McpServer`, and with them the mcp SDK, about a second
to import) are made in the background too: the SDK is imported in a thread once the
backend is entered, so a worker answers calls to its local tools meanwhile. Until then
each configured server counts as `connecting` (`unsettled`, `states`, `summaries`), as
it would while its session opens, and `servers` is empty.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from opentelemetry import trace

from toolbus.backends.mcp.deadlines import CLOSE_DEADLINE_S
from toolbus.config import McpPolicy, McpServerConfig, ToolSettings
from toolbus.tools.registry import Registry

if TYPE_CHECKING:
    from toolbus.backends.mcp.server import McpServer, StateListener

log = logging.getLogger("toolbus.mcp")

SERVER_MODULE = "toolbus.backends.mcp.server"  # imports the mcp SDK


@dataclass(frozen=True, slots=True)
class Summary:
    """What the status page, /readyz and `toolbus mappings` show of one server; also
    for a server not made yet (`connecting`, no error, no tools)."""

    state: str
    last_error: str | None
    tools: int


def load_servers() -> type[McpServer]:
    """`McpServer`, importing the mcp SDK on first use (run in a thread: see the module)."""
    server: type[McpServer] = importlib.import_module(SERVER_MODULE).McpServer
    return server


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
        self.listeners = list(listeners)
        self.configs = {name: cfg for name, cfg in configs.items() if not cfg.disabled}
        policy = policy or McpPolicy()

        def make(server_class: type[McpServer], rank: int, name: str) -> McpServer:
            return server_class(
                name,
                self.configs[name],
                policy,
                registry=registry,
                tool_settings=tool_settings,
                on_state=self._state_changed,
                rank=rank,
                child_env=child_env,
                retry_missing_command=retry_missing_command,
                tracer=tracer,
            )

        self._make = make
        self.servers: dict[str, McpServer] = {}  # made once the SDK is imported (`_start`)
        self._made_event = asyncio.Event()
        if not self.configs:
            self._made_event.set()  # nothing to make: settled from the start
        self._starting: asyncio.Task[None] | None = None
        self._unloadable: str | None = None  # why the SDK did not load (a broken install)
        self._tasks: list[asyncio.Task[None]] = []

    def _state_changed(self, server: McpServer) -> None:
        for listener in self.listeners:
            listener(server)

    @property
    def names(self) -> list[str]:
        """The enabled servers, in configuration order (made or not)."""
        return list(self.configs)

    async def __aenter__(self) -> Self:
        if self.configs:
            self._starting = asyncio.create_task(self._start(), name="mcp:start")
            self._starting.add_done_callback(_report_failed_start)
        return self

    async def _start(self) -> None:
        """Import the SDK off the event loop, then make each server and start its task."""
        try:
            server_class = await asyncio.to_thread(load_servers)
        except Exception as exc:  # a broken install: each server down, saying why
            self._unloadable = f"the mcp SDK could not be loaded: {exc}"
            log.exception("MCP servers not started: %s", self._unloadable)
            self._made_event.set()  # settled: nothing will be made
            return
        self.servers = {
            name: self._make(server_class, rank, name) for rank, name in enumerate(self.configs)
        }
        for server in self.servers.values():
            self._tasks.append(asyncio.create_task(server.serve(), name=f"mcp:{server.name}"))
        self._made_event.set()

    async def wait_settled(self) -> None:
        """Until every server is ready or has exhausted its start-up attempts."""
        await self._made_event.wait()
        await asyncio.gather(*(s.wait_settled() for s in self.servers.values()))

    def unsettled(self) -> list[str]:
        if not self._made_event.is_set():
            return self.names  # not made yet: all still starting
        if self._unloadable is not None:
            return []  # down for good: none will start
        return [name for name, server in self.servers.items() if not server.settled]

    def states(self) -> dict[str, str]:
        if not self._made_event.is_set():
            return dict.fromkeys(self.configs, "connecting")
        if self._unloadable is not None:
            return dict.fromkeys(self.configs, "down")
        return {name: server.state for name, server in self.servers.items()}

    def summaries(self) -> dict[str, Summary]:
        """Each enabled server's state, last error and tool count, made or not."""
        if not self._made_event.is_set():
            return dict.fromkeys(self.configs, Summary("connecting", None, 0))
        if self._unloadable is not None:
            return dict.fromkeys(self.configs, Summary("down", self._unloadable, 0))
        return {
            name: Summary(server.state, server.last_error, len(server.tool_names))
            for name, server in self.servers.items()
        }

    def partial_lines(self) -> dict[str, int]:
        """Unfinished stdout lines dropped so far, by server."""
        if not self._made_event.is_set():
            return dict.fromkeys(self.configs, 0)
        return {name: server.partial_stdout_lines for name, server in self.servers.items()}

    close_bound_s = CLOSE_DEADLINE_S * 3
    """The longest `__aexit__` takes: servers close together, stragglers are cancelled."""

    async def __aexit__(self, *exc: object) -> None:
        if self._starting is not None and not self._starting.done():
            # Stopped while the SDK loads: no server is made. The import's thread runs
            # on to its end (a thread cannot be stopped); nothing waits for it here.
            self._starting.cancel()
            await asyncio.wait({self._starting})
        for server in self.servers.values():
            server.stop()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=CLOSE_DEADLINE_S * 2)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_DEADLINE_S)


def _report_failed_start(task: asyncio.Task[None]) -> None:
    """The servers' start failed otherwise than the SDK's import (`_start` says that
    one, each server `down` with why): said; the local tools are served on."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("MCP servers not started: %s", error, exc_info=error)
