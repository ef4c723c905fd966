"""MCP backend: the only module that imports mcp.

Each configured server gets one long-lived `ClientSession`, started in its own
named task, initialized once; its tools are registered under their own names and
every call is multiplexed over that session. The server's stderr is read through
a pipe into the worker's log (and a bounded ring buffer), never mixed with the
protocol on stdout. A server that cannot start leaves the worker serving the rest.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Literal

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, PaginatedRequestParams

from worker.config import McpServerConfig, ToolSettings
from worker.contracts import ContentItem, ToolResult
from worker.errors import CallTimeout, ToolFailed, Unavailable
from worker.registry import Registry, Tool, sanitize_name

log = logging.getLogger("toolbus.mcp")

ServerState = Literal["connecting", "ready", "down", "stopped"]
StateListener = Callable[[str, ServerState], None]

STDERR_LINES_KEPT = 50
STOP_DEADLINE_S = 5.0


class McpServer:
    """One MCP server and its session, owned by the task running `serve()`."""

    def __init__(
        self, name: str, config: McpServerConfig, on_state: StateListener, rank: int = 0
    ) -> None:
        self.name = name
        self.rank = rank  # configuration order: the first listed owns a shared bare name
        self.origin = f"mcp:{name}"
        self.config = config
        self.state: ServerState = "connecting"
        self.last_error: str | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES_KEPT)
        self._session: ClientSession | None = None
        self._on_state = on_state
        self._settled = asyncio.Event()
        self._stop = asyncio.Event()

    def _set_state(self, state: ServerState, error: str | None = None) -> None:
        self.state = state
        self.last_error = error
        if state != "connecting":
            self._settled.set()
        self._on_state(self.name, state)

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def stop(self) -> None:
        self._stop.set()

    async def serve(self, registry: Registry, tool_settings: Mapping[str, ToolSettings]) -> None:
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        stderr_task = asyncio.create_task(
            self._pump_stderr(read_fd), name=f"mcp-stderr:{self.name}"
        )
        try:
            async with AsyncExitStack() as stack:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    read, write = await self._open_transport(stack, errlog)
                    # The child holds its own copy of the pipe now; closing ours lets
                    # the stderr pump see EOF when the server exits.
                    errlog.close()
                    session = await stack.enter_async_context(
                        ClientSession(read, write, message_handler=self._on_message)
                    )
                    await session.initialize()
                    tools = await self._list_tools(session)
                self._session = session
                registry.register_all(self._tool(t, tool_settings) for t in tools)
                log.info(
                    "MCP server %s ready with %d tools: %s",
                    self.name,
                    len(tools),
                    ", ".join(t.name for t in tools),
                )
                self._set_state("ready")
                await self._stop.wait()
        except Exception as exc:
            reason = _describe(exc)
            self._set_state("down", reason)
            log.error(  # noqa: TRY400  (the reason is the useful part, not our traceback)
                "MCP server %s is unavailable: %s; stderr tail: %s; the worker goes on without it",
                self.name,
                reason,
                " | ".join(self.stderr_tail) or "(empty)",
            )
        finally:
            self._session = None
            if not errlog.closed:
                errlog.close()
            if self.state != "down":
                self._set_state("stopped")
            try:
                async with asyncio.timeout(STOP_DEADLINE_S):
                    await stderr_task
            except TimeoutError:
                stderr_task.cancel()

    async def _open_transport(self, stack: AsyncExitStack, errlog: Any) -> Any:
        cfg = self.config
        if cfg.command is not None:
            params = StdioServerParameters(
                command=cfg.command, args=cfg.args, env=cfg.env or None, cwd=cfg.cwd
            )
            return await stack.enter_async_context(stdio_client(params, errlog=errlog))
        assert cfg.url is not None
        # The SDK leaves a client it was given open: the stack closes ours.
        http = await stack.enter_async_context(create_mcp_http_client(headers=cfg.headers or None))
        return await stack.enter_async_context(streamable_http_client(cfg.url, http_client=http))

    async def _list_tools(self, session: ClientSession) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    def _tool(self, listed: Any, tool_settings: Mapping[str, ToolSettings]) -> Tool:
        remote_name: str = listed.name
        name = sanitize_name(remote_name)
        if name != remote_name:
            log.warning(
                "MCP server %s announced tool %r: registered as %s", self.name, remote_name, name
            )
        override = tool_settings.get(f"{self.name}.{name}") or tool_settings.get(name)

        async def invoke(arguments: dict[str, Any]) -> ToolResult:
            return await self.call(remote_name, arguments)

        return Tool(
            name=name,
            description=listed.description or "",
            input_schema=dict(listed.input_schema or {"type": "object"}),
            invoke=invoke,
            origin=self.origin,
            server=self.name,
            original_name=remote_name if name != remote_name else None,
            rank=self.rank,
            rename_arguments=override.rename_arguments is not False if override else True,
            timeout_s=override.timeout_s if override else None,
            model_invocable=override.model_invocable if override else True,
        )

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> ToolResult:
        session = self._session
        if session is None or self.state != "ready":
            raise Unavailable(f"MCP server {self.name} is {self.state}", server=self.name)
        try:
            result = await session.call_tool(remote_name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._set_state("down", exc.message)
                raise Unavailable(
                    f"MCP server {self.name} closed the connection", server=self.name
                ) from exc
            if exc.code == REQUEST_TIMEOUT:
                raise CallTimeout(f"MCP server {self.name} timed out", server=self.name) from exc
            raise ToolFailed(exc.message, server=self.name, mcp_code=exc.code) from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            self._set_state("down", _describe(exc))
            raise Unavailable(
                f"MCP server {self.name} is unreachable: {_describe(exc)}", server=self.name
            ) from exc
        converted = _result(result)
        if result.is_error:
            # The server's own words reach the caller unchanged.
            raise ToolFailed(converted.text, server=self.name)
        return converted

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.warning(
                "MCP server %s sent something unreadable: %s", self.name, str(message)[:200]
            )

    async def _pump_stderr(self, read_fd: int) -> None:
        server_log = logging.getLogger(f"toolbus.mcp.{self.name}")
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe = os.fdopen(read_fd, "rb")
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            while line := await reader.readline():
                text = line.decode("utf-8", "replace").rstrip()
                if text:
                    self.stderr_tail.append(text[:500])
                    server_log.info("%s", text)
        finally:
            transport.close()


def _result(result: Any) -> ToolResult:
    texts: list[str] = []
    other: list[ContentItem] = []
    for block in result.content:
        kind = getattr(block, "type", "unknown")
        if kind == "text":
            texts.append(block.text)
        elif kind in ("image", "audio"):
            other.append(ContentItem(type=kind, mime_type=block.mime_type, data=block.data))
        elif kind == "resource":
            res = block.resource
            other.append(
                ContentItem(
                    type=kind,
                    uri=str(res.uri),
                    mime_type=getattr(res, "mime_type", None),
                    text=getattr(res, "text", None),
                    data=getattr(res, "blob", None),
                )
            )
        elif kind == "resource_link":
            other.append(ContentItem(type=kind, uri=str(block.uri), mime_type=block.mime_type))
        else:
            raw = json.dumps(block.model_dump(mode="json"), ensure_ascii=False)
            other.append(ContentItem(type=kind, data=base64.b64encode(raw.encode()).decode()))
    structured = result.structured_content
    return ToolResult(
        text="\n".join(texts),
        structured=structured if isinstance(structured, dict) else None,
        content=other or None,
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return "timed out while starting"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpBackend:
    """All configured MCP servers; `async with` starts them, exit stops them."""

    def __init__(
        self,
        configs: Mapping[str, McpServerConfig],
        registry: Registry,
        tool_settings: Mapping[str, ToolSettings],
        on_state: StateListener,
    ) -> None:
        self.servers = {
            name: McpServer(name, cfg, on_state, rank)
            for rank, (name, cfg) in enumerate(configs.items())
            if not cfg.disabled
        }
        self._registry = registry
        self._tool_settings = tool_settings
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> McpBackend:
        # Servers connect concurrently and in the background: the worker never
        # waits on them to start serving the tools it already has.
        for server in self.servers.values():
            self._tasks.append(
                asyncio.create_task(
                    server.serve(self._registry, self._tool_settings), name=f"mcp:{server.name}"
                )
            )
        return self

    async def wait_settled(self) -> None:
        """Until every server is ready or has failed (tests and `--wait` use this)."""
        await asyncio.gather(*(s.wait_settled() for s in self.servers.values()))

    def states(self) -> dict[str, str]:
        return {name: server.state for name, server in self.servers.items()}

    async def __aexit__(self, *exc: object) -> None:
        for server in self.servers.values():
            server.stop()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=STOP_DEADLINE_S * 2)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=STOP_DEADLINE_S)
