"""One MCP server: its session, its state, its retries, its calls.

Each configured server gets one long-lived `ClientSession` at a time, owned by the
server's own task. That task connects (tenacity: `[mcp].startup_attempts` with doubling
delays), registers the tools, holds the session until it ends, and reconnects in the
background with capped, jittered backoff, for as long as the worker runs. Its tools
stay registered while it is away, so calls get `unavailable` naming the server, never
`unknown_tool`. A session opens at the newest protocol version both sides speak (`era`);
it is kept by `keeping` (tool list changes, HTTP health checks every
`[mcp].health_interval_s`). A tool call is never re-sent; a result over `max_result_bytes`,
or one breaking the tool's `outputSchema`, is that call's `tool_error`, no more.

States: `connecting` (start-up), `ready`, `degraded` (lost its session, reconnecting),
`down` (start-up attempts exhausted; still retried in the background), `stopped`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Literal

from mcp import ClientSession
from mcp.client import IncomingMessage
from mcp_types import ToolListChangedNotification
from opentelemetry import trace
from tenacity import RetryCallState

from toolbus.backends.mcp.asking import Asking
from toolbus.backends.mcp.call import CallPlan, send
from toolbus.backends.mcp.convert import bad_line, checked_result, describe
from toolbus.backends.mcp.deadlines import CLOSE_DEADLINE_S
from toolbus.backends.mcp.era import listen_for_tool_changes, negotiate
from toolbus.backends.mcp.hints import startup_hint
from toolbus.backends.mcp.http import open_http
from toolbus.backends.mcp.keeping import keep
from toolbus.backends.mcp.listing import ToolListing
from toolbus.backends.mcp.output_schema import schema_violation
from toolbus.backends.mcp.retry import (
    Stopping,
    connect_attempts,
    log_connected,
    log_exhausted,
    log_failed_attempt,
    log_protocol,
)
from toolbus.backends.mcp.session import Ending, Session, list_tools
from toolbus.backends.mcp.stderr import StderrTail, by_attempt
from toolbus.backends.mcp.stdio import open_stdio
from toolbus.config import McpPolicy, McpServerConfig, ToolSettings
from toolbus.observability.spans import server_attributes
from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.registry import Registry
from toolbus.wire.contracts import ToolResult
from toolbus.wire.errors import Unavailable

log = logging.getLogger("toolbus.mcp")

ServerState = Literal["connecting", "ready", "degraded", "down", "stopped"]
StateListener = Callable[["McpServer"], None]

STDERR_LINES_KEPT = 50


class McpServer:
    """One MCP server and its session, owned by the task running `serve()`."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        policy: McpPolicy,
        *,
        registry: Registry,
        tool_settings: Mapping[str, ToolSettings],
        on_state: StateListener,
        rank: int = 0,
        child_env: Mapping[str, str] | None = None,
        retry_missing_command: bool = True,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.name = name
        self._retry_missing_command = retry_missing_command  # see `retry.connect_attempts`
        self._tracer = tracer or trace.get_tracer("toolbus.mcp")  # the CLIENT span's: the worker's
        self._child_env = dict(child_env or {})  # e.g. OTEL_*: the server's own env wins
        self.origin = f"mcp:{name}"
        self.config = config
        self.policy = policy
        self.rank = rank  # configuration order: the first listed owns a shared bare name
        self.state: ServerState = "connecting"
        self.last_error: str | None = None
        self.stderr_tail = StderrTail(STDERR_LINES_KEPT)
        self._marks: list[int] = []  # where each attempt's stderr lines begin (`by_attempt`)
        self._after = 0  # attempts made before this (re)connect's: numbered on from there
        self.bad_stdout_lines = 0
        self.partial_stdout_lines = 0  # dropped unfinished (`stdio.PARTIAL_LINE_S`)
        self.connects = 0
        self.protocol_version: str | None = None  # the last session's (`era.negotiate`)
        self.attempts = 0  # of the current (re)connect: start-up's go on in the background
        self._current: Session | None = None
        self._asking = Asking(name)  # its questions, to its calls' callers (asking.py)
        self._on_state = on_state
        self._settled = asyncio.Event()
        self._stop = asyncio.Event()
        self._limit = config.max_in_flight or policy.max_in_flight
        self.max_result_bytes = config.max_result_bytes or policy.max_result_bytes
        self._span_attributes: dict[str, Any] = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "toolbus.mcp.server": name,
            # A URL may carry a token (userinfo, query): never the whole of it.
            **(server_attributes(config.url) if config.url else {"network.transport": "pipe"}),
        }
        self._registry = registry
        self._tools = ToolListing(
            name,
            self.origin,
            rank=rank,
            registry=registry,
            tool_settings=tool_settings,
            slots=(self._limit, asyncio.Semaphore(self._limit)),
            span_attributes=self._span_attributes,
            invoke=self._call,
        )

    @property
    def tool_names(self) -> list[str]:
        return self._tools.tool_names

    # -- state -----------------------------------------------------------------

    def _set_state(self, state: ServerState, error: str | None = None) -> None:
        changed = (state, error) != (self.state, self.last_error)
        self.state, self.last_error = state, error
        if state != "connecting":
            self._settled.set()
        if changed:
            self._on_state(self)

    @property
    def settled(self) -> bool:
        """Ready, or start-up attempts exhausted: no longer `connecting`."""
        return self._settled.is_set()

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def stop(self) -> None:
        self._stop.set()

    # -- the server's task ---------------------------------------------------------

    async def serve(self) -> None:
        """Connect, hold, reconnect: the server's task, until `stop()`."""
        startup, after = True, 0
        try:
            while not self._stop.is_set():
                try:
                    lifetime = await self._connect(startup, after)
                except Stopping:
                    break
                except Exception as exc:  # start-up exhausted: degrade, keep trying
                    if self._stop.is_set():
                        break  # the retries ended because the worker stops: nothing failed
                    self._report_startup_failure(exc)
                    startup, after = False, self.attempts  # the background's number on
                    continue
                startup, after = False, 0  # a lost session's reconnects count afresh
                why = await self._until_over(lifetime)
                if not self._stop.is_set():
                    log.warning("mcp server lost", extra={"server": self.name, "error": why})
                    self._set_state("degraded", why)
        finally:
            self._set_state("stopped", self.last_error)

    async def _connect(self, startup: bool, after: int) -> asyncio.Task[str]:
        retrying = connect_attempts(
            self.policy,
            startup=startup,
            stopping=self._stop,
            before_sleep=self._log_retry,
            retry_missing_command=self._retry_missing_command,
        )
        self._after, self._marks = after, []
        async for attempt in retrying:
            with attempt:
                if self._stop.is_set():
                    raise Stopping
                self.attempts = number = after + attempt.retry_state.attempt_number
                self._marks.append(self.stderr_tail.appended)
                lifetime = await self._open_in_own_task()
                if number > 1:
                    log_connected(self.name, number)
                return lifetime
        raise Stopping  # unreachable: reraise=True re-raises the last failure

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
        """One session, start to end, in a task of its own: the transport's anyio task
        groups are entered here, so when a connection dies and anyio cancels their scope,
        it is this task that is cancelled, never the server's task with its retry loop."""
        try:
            current = await self._open()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(
                    exc if isinstance(exc, Exception) else ConnectionError(describe(exc))
                )
            return "the session never opened"
        opened.set_result(None)
        try:
            await self._hold(current)
        except asyncio.CancelledError:
            if self._stop.is_set():
                raise
            current.end("the connection was lost")
        finally:
            current.end("the session ended")  # no-op if it had: its listener tells the state
            self._current = None
            await current.close()
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
        return f"the session failed: {describe(failure)}" if failure else lifetime.result()

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        self.last_error = describe(error) if error else None
        number = self._after + state.attempt_number
        log_failed_attempt(self.name, number, self.last_error, delay, background=self._after > 0)

    def _report_startup_failure(self, exc: BaseException) -> None:
        reason = describe(exc)
        self._set_state("down", reason)
        hint = startup_hint(self.name, self.config, exc, self._child_env)
        tail, shown = by_attempt(self.stderr_tail, self._marks)
        log_exhausted(
            self.name, self.attempts, reason, tail, self._registry, shown=shown, hint=hint
        )

    def _session_ended(self, why: str) -> None:
        """Told the moment a ready session ends, whoever ends it: from then on the state
        says so, before the session is closed (a stdio server may take seconds to stop),
        so a call refused meanwhile is told why, not that the server is `ready`."""
        if self.state != "ready":
            return  # a session ending while it opens: the retries report it
        if self._stop.is_set():
            self._set_state("stopped", self.last_error)
        else:
            self._set_state("degraded", why)

    async def _open(self) -> Session:
        ending = Ending(listener=self._session_ended)
        try:
            # On failure the stack must exit *with* the exception: anyio turns its
            # cancel-scope cancellation into the real error (e.g. ConnectError) there.
            async with AsyncExitStack() as stack:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    session = await self._open_session(stack, ending)
                    self.protocol_version = await negotiate(session)
                    tools = await list_tools(session)
                    listening = await listen_for_tool_changes(stack, session, self.name)
                self.connects += 1
                log_protocol(self.name, self.protocol_version, listening is not None)
                # The holder closes it, later, in this same task.
                ping_s = self.config.connect_timeout_s if self.config.command is None else None
                return Session(
                    session, tools, stack.pop_all(), ending, ping_s, self._asking, listening
                )
        except Exception as exc:
            if ending.event.is_set():  # the server's side ended first: that is why
                raise ConnectionError(ending.why) from exc
            raise

    async def _open_session(self, stack: AsyncExitStack, ending: Ending) -> ClientSession:
        if self.config.command is None:
            return await open_http(
                stack, self.config, self._on_message, self._asking, on_end=ending.end
            )
        return await open_stdio(
            stack,
            self.name,
            self.config,
            child_env=self._child_env,
            max_result_bytes=self.max_result_bytes,
            tail=self.stderr_tail,
            on_end=ending.end,
            on_partial=self._partial_dropped,
            message_handler=self._on_message,
            asking=self._asking,
        )

    async def _hold(self, current: Session) -> None:
        """Serve through this session until it ends or the worker stops (`keeping`)."""
        if current.ended.is_set():
            return  # ended while opening: never `ready` (its listener heard nothing then)
        self._current = current
        self._tools.sync(current.tools)
        self._set_state("ready")
        await keep(
            current,
            self._tools,
            server=self.name,
            stop=self._stop,
            health_s=self.policy.health_interval_s if self.config.url else math.inf,
            timeout_s=self.config.connect_timeout_s,
        )

    def limit(self, remote_name: str) -> int:
        """Calls to this tool that may run at once: its own limit, else the server's."""
        return self._tools.limit(remote_name)

    # -- calls ---------------------------------------------------------------------

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a tool by its name on the server (the registry's tools are bound to their plan)."""
        return await self._call(self._tools.plan(remote_name), arguments, DETACHED)

    async def _call(
        self, plan: CallPlan, arguments: dict[str, Any], ctx: CallContext
    ) -> ToolResult:
        # Waiting for a slot counts against the call's deadline (the executor's timeout).
        async with plan.slots:
            current = self._current
            if current is None or current.ended.is_set():
                refused = Unavailable(
                    f"MCP server {self.name} is {self.state}"
                    + (f": {self.last_error}" if self.last_error else ""),
                    server=self.name,
                    state=self.state,
                )
                refused.reached_tool = False  # nothing was sent: a repeat may run it
                raise refused
            try:
                result = await send(current, plan, arguments, self._tracer, ctx)
            except RuntimeError as exc:  # the SDK's output-schema check: this call's error
                violation = schema_violation(exc, self.name, plan.remote_name)
                if violation is None:
                    raise
                raise violation from None  # its text quotes the value: never chained
        return checked_result(result, self.name, self.max_result_bytes)

    def _partial_dropped(self) -> None:
        self.partial_stdout_lines += 1

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            self.bad_stdout_lines += 1
            log.warning(
                "MCP server %s wrote a line that is not JSON-RPC (%d so far): %s",
                self.name,
                self.bad_stdout_lines,
                bad_line(message),
            )
        elif isinstance(message, ToolListChangedNotification):
            self._tools.ask()  # re-listed by the server's task, paced, not in the dispatcher
