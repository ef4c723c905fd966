"""MCP backend: the only module that imports mcp.

Each configured server gets one long-lived `ClientSession` at a time, owned by the
server's own task. That task connects (tenacity: `[mcp].startup_attempts` with doubling
delays), registers the tools, holds the session until it ends, and reconnects in the
background with capped, jittered backoff, for as long as the worker runs. Its tools
stay registered while it is away, so calls get `unavailable` naming the server, never
`unknown_tool`. A stdio server's stderr goes to the worker's log and a bounded ring
buffer, never mixed with the protocol; its end (EOF on stderr) ends the session at once.
HTTP sessions are pinged every `[mcp].health_interval_s`. A tool call is never re-sent.

States: `connecting` (start-up), `ready`, `degraded` (lost its session, reconnecting),
`down` (start-up attempts exhausted; still retried in the background), `stopped`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    PaginatedRequestParams,
    ToolListChangedNotification,
)
from opentelemetry import trace
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from toolbus.config import McpPolicy, McpServerConfig, ToolSettings, tool_settings
from toolbus.contracts import ContentItem, ToolResult
from toolbus.errors import CallTimeout, ToolFailed, Unavailable
from toolbus.registry import Registry, Tool, sanitize_name

log = logging.getLogger("toolbus.mcp")
_tracer = trace.get_tracer("toolbus.mcp")

ServerState = Literal["connecting", "ready", "degraded", "down", "stopped"]
StateListener = Callable[["McpServer"], None]

STDERR_LINES_KEPT = 50
BAD_LINE_CHARS = 200
CLOSE_DEADLINE_S = 5.0  # the SDK's stdio shutdown waits 2 s, then terminates the tree
TRANSPORT_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError)


class _Stopping(Exception):
    """The worker is stopping: no more attempts."""


class stop_when(stop_base):  # noqa: N801  (named like tenacity's own stop strategies)
    """Stop retrying once `predicate()` is true (the worker is stopping)."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        self._predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._predicate()


@dataclass
class _Session:
    session: ClientSession
    tools: list[Any]
    stack: AsyncExitStack
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = "the session ended"


class McpServer:
    """One MCP server and its session, owned by the task running `serve()`."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        policy: McpPolicy,
        on_state: StateListener,
        rank: int = 0,
        *,
        child_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self._child_env = dict(child_env or {})  # e.g. OTEL_*: the server's own env wins
        self.origin = f"mcp:{name}"
        self.config = config
        self.policy = policy
        self.rank = rank  # configuration order: the first listed owns a shared bare name
        self.state: ServerState = "connecting"
        self.last_error: str | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES_KEPT)
        self.bad_stdout_lines = 0
        self.tool_names: list[str] = []
        self.connects = 0
        self._current: _Session | None = None
        self._on_state = on_state
        self._settled = asyncio.Event()
        self._stop = asyncio.Event()
        self._tools_changed = asyncio.Event()
        self._slots = asyncio.Semaphore(config.max_in_flight or policy.max_in_flight)
        self._tool_slots: dict[str, asyncio.Semaphore] = {}
        self._registry: Registry | None = None
        self._tool_settings: Mapping[str, ToolSettings] = {}

    # -- state -----------------------------------------------------------------

    def _set_state(self, state: ServerState, error: str | None = None) -> None:
        changed = (state, error) != (self.state, self.last_error)
        self.state, self.last_error = state, error
        if state != "connecting":
            self._settled.set()
        if changed:
            self._on_state(self)

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def stop(self) -> None:
        self._stop.set()

    # -- the server's task ---------------------------------------------------------

    async def serve(self, registry: Registry, tool_settings: Mapping[str, ToolSettings]) -> None:
        self._registry, self._tool_settings = registry, tool_settings
        startup = True
        try:
            while not self._stop.is_set():
                try:
                    lifetime = await self._connect(startup)
                except _Stopping:
                    break
                except Exception as exc:  # start-up exhausted: degrade, keep trying
                    self._report_startup_failure(exc)
                    startup = False
                    continue
                startup = False
                why = await self._until_over(lifetime)
                if not self._stop.is_set():
                    log.warning("MCP server %s: %s; reconnecting", self.name, why)
                    self._set_state("degraded", why)
        finally:
            self._set_state("stopped", self.last_error)

    async def _connect(self, startup: bool) -> asyncio.Task[str]:
        policy = self.policy
        wait = (
            wait_exponential(multiplier=policy.startup_base_delay_s, exp_base=2)
            if startup
            else wait_random_exponential(
                multiplier=max(policy.startup_base_delay_s, 0.1), max=policy.recovery_max_delay_s
            )
        )
        stopping = stop_when(self._stop.is_set)
        stop = stop_after_attempt(policy.startup_attempts) | stopping if startup else stopping
        retrying = AsyncRetrying(
            stop=stop,
            wait=wait,
            retry=retry_if_not_exception_type(_Stopping),
            sleep=self._sleep_unless_stopped,
            before_sleep=self._log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if self._stop.is_set():
                    raise _Stopping
                number = attempt.retry_state.attempt_number
                lifetime = await self._open_in_own_task()
                if number > 1:
                    log.info(
                        "MCP connection succeeded on attempt %d (server %s)", number, self.name
                    )
                return lifetime
        raise _Stopping  # unreachable: reraise=True re-raises the last failure

    async def _open_in_own_task(self) -> asyncio.Task[str]:
        """Start a session's task; return it once the session is open, or raise why not."""
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lifetime = asyncio.create_task(self._lifetime(opened), name=f"mcp-session:{self.name}")
        racing: list[asyncio.Future[Any]] = [opened, lifetime]
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        if opened.done() and opened.exception() is None:
            return lifetime
        await asyncio.wait({lifetime})  # the open failed; the task is finishing
        failure = opened.exception() if opened.done() else None
        raise failure or ConnectionError("the session ended while opening")

    async def _lifetime(self, opened: asyncio.Future[None]) -> str:
        """One session, start to end, in a task of its own.

        The transport's anyio task groups are entered here, so when a connection dies
        and anyio cancels their scope, it is this task that is cancelled, never the
        server's task with its retry loop.
        """
        try:
            current = await self._open()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(
                    exc if isinstance(exc, Exception) else ConnectionError(_describe(exc))
                )
            return "the session never opened"
        opened.set_result(None)
        try:
            await self._hold(current)
        except asyncio.CancelledError:
            if self._stop.is_set():
                raise
            self._end(current, "the connection was lost")
        finally:
            self._current = None
            await self._close(current.stack)
        return current.why

    async def _until_over(self, lifetime: asyncio.Task[str]) -> str:
        """Wait for a session's task to end; on stop, give it its deadline."""
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({lifetime, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        done, _ = await asyncio.wait({lifetime}, timeout=CLOSE_DEADLINE_S * 2)
        if not done:
            lifetime.cancel()
            await asyncio.wait({lifetime}, timeout=CLOSE_DEADLINE_S)
        if not lifetime.done() or lifetime.cancelled():
            return "the session was cancelled"
        failure = lifetime.exception()
        return f"the session failed: {_describe(failure)}" if failure else lifetime.result()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        self.last_error = _describe(error) if error else None
        log.warning(
            "MCP server %s: attempt %d failed (%s); next attempt in %.1f s",
            self.name,
            state.attempt_number,
            self.last_error,
            delay,
        )

    def _report_startup_failure(self, exc: BaseException) -> None:
        reason = _describe(exc)
        self._set_state("down", reason)
        have = self._registry.names() if self._registry else []
        log.error(
            "MCP connection failed after %d attempts (server %s): %s. Stderr tail: %s. "
            "Check that the command or URL in mcpServers.%s is right and starts on its own. "
            "The worker continues in degraded mode with the tools it has: %s; "
            "this server is retried in the background.",
            self.policy.startup_attempts,
            self.name,
            reason,
            " | ".join(self.stderr_tail) or "(empty)",
            self.name,
            ", ".join(have) or "none",
        )

    async def _open(self) -> _Session:
        ended = asyncio.Event()
        # On failure the stack must exit *with* the exception: anyio turns its
        # cancel-scope cancellation into the real error (e.g. ConnectError) there.
        async with AsyncExitStack() as stack:
            async with asyncio.timeout(self.config.connect_timeout_s):
                read, write = await self._open_transport(stack, ended)
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                await session.initialize()
                tools = await self._list_tools(session)
            self.connects += 1
            # The holder closes it, later, in this same task.
            return _Session(session, tools, stack.pop_all(), ended)

    async def _open_transport(self, stack: AsyncExitStack, ended: asyncio.Event) -> Any:
        cfg = self.config
        if cfg.command is None:
            assert cfg.url is not None
            # The SDK leaves a client it was given open: the stack closes ours.
            http = await stack.enter_async_context(
                create_mcp_http_client(headers=cfg.headers or None)
            )
            return await stack.enter_async_context(
                streamable_http_client(cfg.url, http_client=http)
            )
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        pump = asyncio.create_task(
            self._pump_stderr(read_fd, ended), name=f"mcp-stderr:{self.name}"
        )
        stack.push_async_callback(_finish, pump)
        stack.callback(_close_quietly, errlog)
        env = {**self._child_env, **cfg.env}
        params = StdioServerParameters(
            command=cfg.command, args=cfg.args, env=env or None, cwd=cfg.cwd
        )
        streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        # The child holds its own copy of the pipe now; closing ours lets the pump see
        # EOF the moment the server exits.
        errlog.close()
        return streams

    async def _hold(self, current: _Session) -> None:
        """Serve through this session until it ends or the worker stops."""
        self._current = current
        self._sync_tools(current.tools)
        self._set_state("ready")
        while not self._stop.is_set() and not current.ended.is_set():
            waits = {
                asyncio.ensure_future(self._stop.wait()),
                asyncio.ensure_future(current.ended.wait()),
                asyncio.ensure_future(self._tools_changed.wait()),
            }
            try:
                await asyncio.wait(
                    waits,
                    timeout=self.policy.health_interval_s if self.config.url else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for waiter in waits:
                    waiter.cancel()
            if self._tools_changed.is_set():
                self._tools_changed.clear()
                await self._relist(current)
            elif self.config.url and not current.ended.is_set() and not self._stop.is_set():
                await self._ping(current)

    async def _relist(self, current: _Session) -> None:
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                tools = await self._list_tools(current.session)
        except (MCPError, TimeoutError, *TRANSPORT_ERRORS) as exc:
            self._end(current, f"re-listing tools failed: {_describe(exc)}")
            return
        added, removed = self._sync_tools(tools)
        log.info(
            "MCP server %s changed its tools: added %s, removed %s",
            self.name,
            added or "none",
            removed or "none",
        )

    async def _ping(self, current: _Session) -> None:
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                await current.session.send_ping()
        except (MCPError, TimeoutError, *TRANSPORT_ERRORS) as exc:
            self._end(current, f"health check failed: {_describe(exc)}")

    def _sync_tools(self, listed: list[Any]) -> tuple[list[str], list[str]]:
        assert self._registry is not None
        tools = [self._tool(t) for t in listed]
        self.tool_names = [t.name for t in tools]
        return self._registry.replace_origin(self.origin, tools)

    @staticmethod
    async def _close(stack: AsyncExitStack) -> None:
        try:
            async with asyncio.timeout(CLOSE_DEADLINE_S):
                await stack.aclose()
        except Exception as exc:
            log.debug("closing an MCP session: %s", _describe(exc))

    @staticmethod
    def _end(current: _Session, why: str) -> None:
        if not current.ended.is_set():
            current.why = why
            current.ended.set()

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

    def _tool(self, listed: Any) -> Tool:
        remote_name: str = listed.name
        name = sanitize_name(remote_name)
        if name != remote_name:
            log.warning(
                "MCP server %s announced tool %r: registered as %s", self.name, remote_name, name
            )
        settings = tool_settings(self._tool_settings, name, self.name)
        if settings.max_in_flight:
            self._tool_slots[remote_name] = asyncio.Semaphore(settings.max_in_flight)

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
            rename_arguments=True,  # MCP schemas are someone else's: respell to match them
            settings=settings,
        )

    # -- calls ---------------------------------------------------------------------

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> ToolResult:
        # Waiting for a slot counts against the call's deadline (the executor's timeout).
        async with self._tool_slots.get(remote_name, self._slots):
            current = self._current
            if current is None or current.ended.is_set():
                raise Unavailable(
                    f"MCP server {self.name} is {self.state}"
                    + (f": {self.last_error}" if self.last_error else ""),
                    server=self.name,
                )
            try:
                with _tracer.start_as_current_span(
                    f"tools/call {remote_name}",
                    kind=trace.SpanKind.CLIENT,
                    attributes={
                        "mcp.method.name": "tools/call",
                        "gen_ai.tool.name": remote_name,
                        "gen_ai.operation.name": "execute_tool",
                        "server.address": self.config.url or self.config.command or "",
                        "toolbus.mcp.server": self.name,
                    },
                ):
                    result = await current.session.call_tool(remote_name, arguments)
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    self._end(current, "the connection closed")
                    raise Unavailable(
                        f"MCP server {self.name} closed the connection", server=self.name
                    ) from exc
                if exc.code == REQUEST_TIMEOUT:
                    raise CallTimeout(
                        f"MCP server {self.name} timed out", server=self.name
                    ) from exc
                raise ToolFailed(exc.message, server=self.name, mcp_code=exc.code) from exc
            except TRANSPORT_ERRORS as exc:
                self._end(current, _describe(exc))
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
            self.bad_stdout_lines += 1
            log.warning(
                "MCP server %s wrote a line that is not JSON-RPC (%d so far): %s",
                self.name,
                self.bad_stdout_lines,
                _bad_line(message),
            )
        elif isinstance(message, ToolListChangedNotification):
            self._tools_changed.set()  # re-listed by the server's task, not in the dispatcher

    async def _pump_stderr(self, read_fd: int, ended: asyncio.Event) -> None:
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
            # EOF: the process has exited (or closed stderr, which servers do not).
            current = self._current
            if current is not None and current.ended is ended:
                self._end(current, "the server process exited")
            ended.set()


def _close_quietly(stream: Any) -> None:
    if not stream.closed:
        stream.close()


async def _finish(task: asyncio.Task[None]) -> None:
    try:
        async with asyncio.timeout(CLOSE_DEADLINE_S):
            await task
    except TimeoutError:
        task.cancel()


def _bad_line(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0].get("input")
            if isinstance(first, str | bytes):
                text = first.decode("utf-8", "replace") if isinstance(first, bytes) else first
                return text[:BAD_LINE_CHARS]
    return str(exc)[:BAD_LINE_CHARS]


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
        policy: McpPolicy | None = None,
        *,
        child_env: Mapping[str, str] | None = None,
    ) -> None:
        policy = policy or McpPolicy()
        self.servers = {
            name: McpServer(name, cfg, policy, on_state, rank, child_env=child_env)
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
        """Until every server is ready or has exhausted its start-up attempts."""
        await asyncio.gather(*(s.wait_settled() for s in self.servers.values()))

    def unsettled(self) -> list[str]:
        return [name for name, s in self.servers.items() if not s._settled.is_set()]

    def states(self) -> dict[str, str]:
        return {name: server.state for name, server in self.servers.items()}

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
