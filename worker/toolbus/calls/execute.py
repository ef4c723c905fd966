"""Execute: resolve, check access, guard, normalize, validate and run one call.

This is the one place that classifies outcomes: whatever happens, a call is concluded
once (`conclude`), with an `Outcome` and exactly one log line. `execute()` does it all;
the answerer splits it around deduplication's claim: `start` and `ready` prepare the
call once (preparation.py), `refuse` answers the claim's verdict instead, `run` runs
the prepared call, exactly what the claim compared.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from opentelemetry import trace

from toolbus.calls.approvals import Approvals
from toolbus.calls.call import Call
from toolbus.calls.call_log import log_call
from toolbus.calls.invocation import cancelled, invoke_within
from toolbus.calls.preparation import Outcome, Prepared, Steps
from toolbus.calls.startup import Startup, pending_servers, startup_settled
from toolbus.normalization.guards import Guards
from toolbus.normalization.normalize import Normalizer
from toolbus.observability.metrics import Metrics
from toolbus.observability.spans import (
    default_tracer,
    make_current,
    mark_failed,
    mark_refused,
    open_child_span,
    record_normalization,
    restore,
)
from toolbus.tools.access import Access
from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.definitions import listing
from toolbus.tools.registry import Registry, Resolved, Tool
from toolbus.wire.contracts import PendingServer, ToolResult, ToolsFormat
from toolbus.wire.errors import (
    BadRequest,
    CallTimeout,
    Forbidden,
    InternalError,
    ToolbusError,
    Unavailable,
    UnknownTool,
)
from toolbus.wire.topics import ANONYMOUS_CALLER

# `Outcome` lives with the prepared call it concludes (preparation.py).
__all__ = ["Executor", "Outcome", "Startup"]

log = logging.getLogger("toolbus.execute")


class Executor:
    def __init__(
        self,
        registry: Registry,
        normalizer: Normalizer,
        guards: Guards,
        access: Access,
        *,
        default_timeout_s: float,
        max_timeout_s: float,
        slow_call_ms: float,
        startup: Startup | None = None,
        tracer: trace.Tracer | None = None,
        trace_arguments: bool = False,
        trace_steps: bool = False,
        log_arguments: bool = False,
        metrics: Metrics | None = None,
        root_spans: bool = True,
        approvals: Approvals | None = None,
    ) -> None:
        self.registry = registry
        self.approvals = approvals or Approvals({})  # the calls a person must approve first
        self.normalizer = normalizer
        self.access = access
        self._default_timeout_s = default_timeout_s
        self._max_timeout_s = max_timeout_s
        self._slow_call_ms = slow_call_ms
        self._startup = startup  # backends still registering tools (MCP servers starting)
        self._tracer = tracer or default_tracer()
        self._trace_arguments = trace_arguments  # values may be personal data: off by default
        self._log_arguments = log_arguments  # the same for the per-call log line
        self.metrics = metrics or Metrics()
        # Under a worker every call runs in its message's span whenever it is traced; a
        # call outside any span there is one the pipeline chose not to trace.
        self._root_spans = root_spans
        self._steps = Steps(normalizer, guards, self._tracer, trace_steps=trace_steps)
        self._task_tools: set[str] = set()  # the tools configured `task = true`
        self.registry_changed()
        registry.listeners.append(self.registry_changed)

    def registry_changed(self) -> None:
        """Per-tool tables follow the registry (MCP servers come, go and change tools)."""
        self._steps.clear()
        self.access.refresh(self.registry)
        self.approvals.refresh(self.registry)
        self._task_tools = {tool.name for tool in self.registry.tools() if tool.settings.task}

    def deadline_s(self, call: Call, tool: Tool) -> float:
        """Request beats tool config beats the tool's own default beats the global default;
        capped by `max_timeout_s` and by what remains of the sender's own deadline."""
        chosen = (
            call.timeout_s or tool.settings.timeout_s or tool.timeout_s or self._default_timeout_s
        )
        return _within(call, min(chosen, self._max_timeout_s))

    def cap_s(self, call: Call, tool: Tool) -> float:
        """The hard cap progress may extend a deadline to (`extend_on_progress`): the
        tool's `max_timeout_s`, else the global one; cut to the sender's own deadline."""
        return _within(call, tool.settings.max_timeout_s or self._max_timeout_s)

    def request_deadline_s(self, call: Call) -> float:
        """The deadline before the tool is known: the request's own, or the default."""
        return _within(call, min(call.timeout_s or self._default_timeout_s, self._max_timeout_s))

    def idempotent(self, name: str) -> bool:
        """Is the tool this name resolves to safe to run twice? Unknown names are not."""
        try:
            return self.registry.resolve(name).tool.idempotent
        except ToolbusError:
            return False

    def runs_as_task(self, call: Call) -> bool:
        """Is the call's tool configured to run as a task (`task = true`)? Asked of every
        call: without such a tool (the set follows the registry) nothing is resolved, and
        with one the call is located first (`call/{caller}/{tool}` names its caller)."""
        if not self._task_tools or call.list_tools:
            return False
        try:
            return self.registry.resolve(self.locate(call).tool).name in self._task_tools
        except ToolbusError:
            return False

    def list_tools(
        self,
        caller: str | None,
        tools_format: ToolsFormat = ToolsFormat.TOOLBUS,
        pending: Sequence[PendingServer] = (),
    ) -> Outcome:
        """The tools `caller` may use, as definitions in `tools_format`, their names as text;
        `pending`: the MCP servers whose tools the list may lack."""
        listed = listing(self.registry, tools_format, partial(self.access.allows, caller), pending)
        return Outcome(
            result=ToolResult(text=", ".join(listed.names), structured=listed.structured())
        )

    async def tool_list(self, call: Call) -> Outcome:
        """A request on `{prefix}/tools`. MCP servers still connecting are waited for within
        its deadline, as for a call to their tool; a list still without a server's tools
        names it in `pending`, never passing for complete."""
        if (startup := self._startup) is None:
            return self.list_tools(call.caller, call.tools_format)
        if not _expired(call) and (starting := startup.unsettled()):
            log.info("tool list waits for MCP servers starting", extra={"servers": starting})
            await startup_settled(startup, self.request_deadline_s(call))
        return self.list_tools(call.caller, call.tools_format, pending_servers(startup))

    async def execute(self, call: Call) -> Outcome:
        """One call, start to end: prepared (`ready`), run and concluded (`run`)."""
        if call.list_tools:
            return await self.tool_list(call)
        prepared = self.start(call)
        try:
            await self.ready(prepared)
            return await self.run(prepared)
        except BaseException:  # cancelled: no outcome to conclude, but the span ends
            if prepared.owned:
                prepared.span.end()
            raise

    def start(self, call: Call) -> Prepared:
        """A call about to be prepared: its `execute_tool` span opened (not current)."""
        span, owned = open_child_span(
            self._tracer,
            f"execute_tool {call.tool}",
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": call.id},
            root=self._root_spans,
        )
        return Prepared(call, Outcome(), span, owned, call.arguments, started=time.perf_counter())

    async def ready(self, prepared: Prepared) -> None:
        """Everything before the tool runs, once: the caller located, the sender's deadline
        checked, backends still starting awaited, then `prepare`. A refusal is the
        prepared call's `outcome.error` (`run` reports it); only a cancellation raises."""
        outcome, span = prepared.outcome, prepared.span
        token = make_current(span) if prepared.owned else None
        try:
            call = prepared.call = self.locate(prepared.call)
            # Past its deadline it is still prepared (a repeat of a finished call is then
            # replayed: deduplication needs what it asks for), but it waits for nothing
            # and `run` refuses it; a refusal while preparing it is `expired` too.
            expired = prepared.expired = _expired(call)
            if not expired and self._startup is not None and self._startup.unsettled():
                await self._await_startup(call)  # rare: only while servers start
            try:
                tool, prepared.arguments = self.prepare(call, outcome)
            except ToolbusError:
                if expired:
                    raise _expired_error() from None
                raise
            prepared.tool = tool
            span.update_name(f"execute_tool {outcome.tool}")
            span.set_attribute("gen_ai.tool.name", outcome.tool or call.tool)
            if self._trace_arguments and span.is_recording():
                span.set_attribute(
                    "gen_ai.tool.call.arguments", json.dumps(prepared.arguments, default=str)
                )
        except ToolbusError as error:
            self.refuse(prepared, error)
        except Exception as exc:
            self._internal(prepared, exc)
        finally:
            restore(token)

    def refuse(self, prepared: Prepared, error: ToolbusError) -> None:
        """Answer `error` instead of running the call (deduplication's verdict, a stop)."""
        prepared.outcome.error = error
        prepared.outcome.invoked = prepared.outcome.invoked and error.reached_tool
        mark_refused(prepared.span, error, values=self._trace_arguments)

    async def run(self, prepared: Prepared) -> Outcome:
        """The prepared call's tool run, unless it is refused; then `conclude`d."""
        outcome, call, tool = prepared.outcome, prepared.call, prepared.tool
        # Asked again here, not only on arrival: the claim may have waited (a stalled
        # store, a twin's run) past the deadline. Its sender has stopped waiting, and may
        # have concluded from another copy's answer that nothing ran: no tool starts now.
        prepared.expired = prepared.expired or _expired(call)
        if prepared.expired and outcome.error is None:
            self.refuse(prepared, _expired_error())
        running = prepared.running
        if running is not None and running.cancel_cause is not None and outcome.error is None:
            self.refuse(prepared, cancelled(running, started=False))  # cancelled in time
        if tool is None or outcome.error is not None:
            return self.conclude(prepared)
        token = make_current(prepared.span) if prepared.owned else None
        try:
            outcome.invoked = True
            deadline_s = self.deadline_s(call, tool)
            context: CallContext = running if running is not None else DETACHED
            if running is not None:
                running.span = trace.get_current_span()  # progress events land on it
            outcome.result = await invoke_within(
                tool, prepared.arguments, deadline_s, context, cap_s=self.cap_s(call, tool)
            )
        except ToolbusError as error:
            self.refuse(prepared, error)
        except Exception as exc:
            self._internal(prepared, exc)
        finally:
            restore(token)
        return self.conclude(prepared)

    @staticmethod
    def _internal(prepared: Prepared, exc: Exception) -> None:
        log.exception("internal error in call %s to %s", prepared.call.id, prepared.call.tool)
        prepared.outcome.error = InternalError(f"internal error: {type(exc).__name__}")
        mark_failed(prepared.span, prepared.outcome.error.code.value)

    def conclude(self, prepared: Prepared) -> Outcome:
        """Whatever became of the call, classified once: its span ended, the one log line,
        its metrics. Every call that was not replayed is concluded exactly once."""
        outcome, span = prepared.outcome, prepared.span
        if prepared.concluded:
            return outcome
        prepared.concluded = True
        record_normalization(span, outcome.normalized)
        if prepared.owned:
            span.end()
        outcome.duration_ms = prepared.elapsed_s() * 1000
        self._log(prepared.call, prepared.arguments, outcome)
        # Only resolved names become labels: a caller must not be able to grow them.
        self.metrics.call_done(
            outcome.tool or "(unknown)",
            "ok" if outcome.error is None else outcome.error.code.value,
            outcome.duration_ms / 1000,
            outcome.normalized,
        )
        return outcome

    async def report_configuration(self) -> None:
        """Once every backend has settled, report names in the config that lead nowhere."""
        if self._startup is not None:
            await self._startup.wait_settled()
        for alias, target in self.registry.unknown_aliases().items():
            log.warning("alias %s points at %s, which is no tool", alias, target)
        self.access.report_unknown()

    async def _await_startup(self, call: Call) -> None:
        """A tool not known yet may belong to a server still starting: wait for it, within
        the call's deadline, before calling the name unknown."""
        startup = self._startup
        if startup is None or not startup.unsettled():
            return
        try:
            self._resolve(call)
        except UnknownTool:
            pending = startup.unsettled()
        else:
            return
        if not await startup_settled(startup, self.request_deadline_s(call)):
            raise Unavailable(f"MCP servers still starting: {', '.join(pending)}", servers=pending)
        try:
            self._resolve(call)
        except UnknownTool:
            down = [name for name, state in startup.states().items() if state != "ready"]
            if down:
                raise Unavailable(
                    f"{call.tool!r} is unknown; MCP servers unavailable: {', '.join(down)}",
                    servers=down,
                ) from None

    def prepare(self, call: Call, outcome: Outcome) -> tuple[Tool, dict[str, Any]]:
        """Resolve, check access, then the argument steps (guards, normalize, validate).

        Fills `outcome.tool` and `outcome.normalized` as it goes, so a refusal still
        reports what was changed before it.
        """
        resolved, caller = self._resolve(call)
        outcome.tool = resolved.name
        outcome.normalized.extend(resolved.report)
        self._check_access(caller, resolved)
        return resolved.tool, self._steps.arguments(resolved.tool, call, outcome.normalized)

    def _check_access(self, caller: str | None, resolved: Resolved) -> None:
        if not self.access.allows(caller, resolved.tool):
            who = caller or ANONYMOUS_CALLER
            raise Forbidden(f"caller {who!r} may not use {resolved.name}", caller=who)

    def locate(self, call: Call) -> Call:
        """The call as the registry reads a `call/{a}/{b}` topic in claim mode: caller `a`
        and tool `b`, unless a tool is named `a/b`. The one place this is decided; the
        pipeline asks before quotas (they need the caller), `execute` for direct callers."""
        if not call.topic_path:
            return call
        try:
            self.registry.resolve(call.tool)
        except UnknownTool:
            topic_caller, _, name = call.tool.partition("/")
            if call.caller and call.caller != topic_caller:
                raise BadRequest("the topic and the body name different callers") from None
            return replace(call, caller=topic_caller, tool=name, topic_path=False)
        return replace(call, topic_path=False)  # decided: a later stage must not re-read it

    def _resolve(self, call: Call) -> tuple[Resolved, str | None]:
        """The tool and the caller (`locate` has read the topic already)."""
        return self.registry.resolve(call.tool), call.caller

    def _log(self, call: Call, arguments: dict[str, Any], outcome: Outcome) -> None:
        log_call(
            call,
            arguments,
            tool=outcome.tool or call.tool,
            outcome="ok" if outcome.error is None else outcome.error.code.value,
            duration_ms=outcome.duration_ms,
            slow_call_ms=self._slow_call_ms,
            log_arguments=self._log_arguments,
        )


def _expired(call: Call) -> bool:
    """Did the request's sender stop waiting before it could run? Then it is not run."""
    return call.deadline_at is not None and call.deadline_at <= time.monotonic()


def _expired_error() -> CallTimeout:
    return CallTimeout("the request expired before it could run; it was not run", expired=True)


def _within(call: Call, deadline_s: float) -> float:
    """A deadline cut to what remains of the sender's (message expiry, `deadline_ms`)."""
    if call.deadline_at is None:
        return deadline_s
    return max(0.0, min(deadline_s, call.deadline_at - time.monotonic()))
