"""The guards step: one guard worker, a few calls, each guard judged (`guards.py`).

The guard worker is `toolbus serve` as the bench runs it (`served.py`: the same
`--worker-tree`, `--processes` and `--worker-setting`s, the demo MCP server), plus:
log level INFO in JSON (the call lines), the guard tools (`guard_tools.py`, a plugin
on its PYTHONPATH), the guards' MCP server (`guard_server.py`: progress and cancel on the
MCP path), no progress rate limit (every update must arrive), and tracing to
a decoding sink (`span_sink.py`) with a production's sampler: `parentbased_traceidratio`
at one in a million. Calls without a caller's trace therefore take the unrecorded path
the bench measures, and only the traced guard's calls (one on the settled path, one on
the full), whose trace ids the ratio samples (their low 64 bits under the ratio's
bound), record; the MCP server inherits the OTEL
settings (the worker hands its stdio servers theirs) and exports its own span to the
same sink, flushed every 50 ms.

It runs once per bench run, before the phases, in seconds (most of them the guard
worker and its MCP servers starting); the log is read once the worker has stopped
(SIGTERM, drained), so every call line has been written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from toolbus.cli.bench import guard_tools
from toolbus.cli.bench.guards import (
    CALL_LINES_AT_INFO,
    CANCEL,
    DEDUP_REPEAT,
    DEDUP_RUNNING,
    MCP_CANCEL,
    MCP_PROGRESS,
    PROGRESS,
    SETTLED_EQUALS_FULL,
    TRACED_MCP_CALL,
    GuardResult,
    check_call_lines,
    check_cancel,
    check_dedup,
    check_progress,
    check_same_reply,
    check_trace,
    outcome,
    result,
)
from toolbus.cli.bench.phases import MCP_ARGUMENTS, MCP_TOOL, RAW_MCP_ARGUMENTS
from toolbus.cli.bench.served import Probe, ServeOptions, log_path, served_worker
from toolbus.cli.bench.span_sink import Span, SpanSink, span_sink
from toolbus.transport import MqttConnection
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Inbound, Outbound

GUARD_SERVER = "guards"  # guard_server.py, beside the demo server
# By its path: importing it here would load the mcp SDK into the bench for nothing.
SERVER_PATH = Path(__file__).with_name("guard_server.py")
SAMPLER_RATIO = 1e-6
STEPS = 5
HOLD_S = 20.0  # far past the wait: a call that ends by itself was not cancelled
REPEAT_HOLD_S = 0.5  # the first run of the id held while its repeat comes
REPLY_BOUND_S = 10.0
SPANS_BOUND_S = 10.0
STOPPED_POLL_S = 0.02
GUARD_SETTINGS: tuple[tuple[str, object], ...] = (
    ("log_level", "INFO"),
    ("log_format", "json"),
    ("progress_rate_per_s", 0),  # no limit: every update counts
)


@dataclass(slots=True)
class Seen:
    """What the guard calls brought back."""

    prefix: str
    # The traced calls, by path: "settled" (the schema's keys) and "full" (snake_case).
    trace_ids: dict[str, str] = field(default_factory=dict)
    traced: dict[str, dict[str, Any]] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    settled: dict[str, Any] = field(default_factory=dict)
    full: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    cancelled: list[dict[str, Any]] = field(default_factory=list)
    mcp_steps: list[dict[str, Any]] = field(default_factory=list)
    mcp_cancelled: list[dict[str, Any]] = field(default_factory=list)
    # The held tools saw their cancel while the worker ran (not only a `cancelled` reply).
    cancel_stopped: bool = False
    mcp_cancel_stopped: bool = False
    repeat_id: str = ""  # the id (and key) sent twice
    first: dict[str, Any] = field(default_factory=dict)
    repeat: dict[str, Any] = field(default_factory=dict)
    executions: int = 0
    running_id: str = ""  # the id sent again while its first run held
    running_first: dict[str, Any] = field(default_factory=dict)
    running_repeat: dict[str, Any] = field(default_factory=dict)
    running_executions: int = 0
    ran: list[str] = field(default_factory=list)  # ids of the calls that ran: a line each
    log: str = ""


def sampled_trace_id(ratio: float = SAMPLER_RATIO) -> str:
    """A random trace id that `TraceIdRatioBased(ratio)` samples: its low 64 bits under
    the ratio's bound."""
    bound = round(ratio * 2**64)
    return f"{secrets.randbits(64) | 1 << 63:016x}{1 + secrets.randbelow(bound - 1):016x}"


def run_guards(
    scratch: Path, broker_url: str, serve: ServeOptions, *, dedup_counted: bool = True
) -> list[GuardResult]:
    """Each guard judged on what a guard worker did (`observe`). `dedup_counted` False
    (several processes on the memory store, which is per process) leaves the repeat
    guard out as not promised."""
    return judge(observe(scratch, broker_url, serve), dedup_counted=dedup_counted)


def observe(scratch: Path, broker_url: str, serve: ServeOptions) -> Seen:
    """Starts the guard worker, makes the calls, stops it: what they brought back, the
    spans the sink received, the executions counted and the worker's whole log."""
    prefix = f"guard{uuid.uuid4().hex[:8]}"
    folder, executions = guard_tools.install(scratch)
    with span_sink(keep=True) as sink:
        options = replace(
            serve,
            log_level="INFO",
            otlp_endpoint=sink.endpoint,
            settings=(*serve.settings, *GUARD_SETTINGS),
            python_path=(str(folder),),
            servers=(
                (
                    GUARD_SERVER,
                    {"command": sys.executable, "args": ["-P", str(SERVER_PATH), str(executions)]},
                ),
            ),
            env=(
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", repr(SAMPLER_RATIO)),
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ),
        )
        probes = [
            Probe(f"{prefix}/call/{tool}", json.dumps({"arguments": arguments}).encode())
            for tool, arguments in (("echo", {"text": "x"}), (guard_tools.MCP_STEPS_TOOL, {"n": 1}))
        ]
        seen = Seen(prefix)
        with served_worker(scratch, broker_url, prefix, options, probes):
            asyncio.run(_calls(broker_url, seen, sink, executions))
    seen.executions = guard_tools.executions(executions, seen.repeat_id)
    seen.running_executions = guard_tools.executions(executions, seen.running_id)
    seen.log = log_path(scratch, prefix).read_text(errors="replace")
    return seen


def judge(seen: Seen, *, dedup_counted: bool = True) -> list[GuardResult]:
    results = [
        result(
            TRACED_MCP_CALL,
            _traced(seen),
            f"CLIENT and server `tools/call {MCP_TOOL}` spans in the caller's trace, "
            "settled and full path",
        ),
        result(
            SETTLED_EQUALS_FULL,
            check_same_reply(seen.settled, seen.full),
            f"{MCP_TOOL}: the same reply from the schema's keys and from snake_case",
        ),
        result(
            CALL_LINES_AT_INFO,
            check_call_lines(seen.log, seen.ran),
            f"a call line for each of {len(seen.ran)} calls",
        ),
        result(PROGRESS, check_progress(seen.steps, STEPS), f"updates 1..{STEPS}, then ok"),
        result(
            MCP_PROGRESS,
            check_progress(seen.mcp_steps, STEPS),
            f"an MCP server's updates 1..{STEPS}, then ok",
        ),
        result(
            CANCEL,
            check_cancel(seen.cancelled, stopped=seen.cancel_stopped),
            "cancelled while running: `cancelled`, the tool stopped",
        ),
        result(
            MCP_CANCEL,
            check_cancel(seen.mcp_cancelled, stopped=seen.mcp_cancel_stopped),
            "an MCP call cancelled while running: `cancelled`, the server's tool stopped",
        ),
    ]
    if not dedup_counted:
        skipped = "skipped: the memory store is per process"
        return [*results, *(GuardResult(n, True, skipped) for n in (DEDUP_REPEAT, DEDUP_RUNNING))]
    after = check_dedup(seen.first, seen.repeat, seen.executions)
    running = check_dedup(seen.running_first, seen.running_repeat, seen.running_executions)
    return [
        *results,
        result(DEDUP_REPEAT, after, "one id sent again after its reply: ran once, replayed"),
        result(DEDUP_RUNNING, running, "one id sent again while it ran: ran once, replayed"),
    ]


def _traced(seen: Seen) -> str | None:
    """The trace guard on each path's call; its failures, with how the call ended."""
    failed = []
    for path in ("settled", "full"):
        trace_id = seen.trace_ids.get(path, "")
        failure = check_trace(seen.spans, trace_id, MCP_TOOL)
        if failure is not None:
            ended = outcome(seen.traced.get(path, {}))
            failed.append(f"{path} path: {failure}" + ("" if ended == "ok" else f", {ended}"))
    return "; ".join(failed) or None


async def _calls(broker_url: str, seen: Seen, sink: SpanSink, executions: Path) -> None:
    reply_topic = f"{seen.prefix}/reply/guards-{uuid.uuid4().hex[:8]}"
    async with MqttConnection(BrokerUrl.from_url(broker_url)) as conn:
        await conn.subscribe([reply_topic])
        caller = _Caller(conn, seen.prefix, reply_topic)
        reader = asyncio.create_task(caller.read(conn.messages()), name="guard-replies")
        try:
            await _guard_calls(caller, seen, executions)
        finally:
            reader.cancel()
        seen.ran = caller.ran  # each id once: a repeat runs nothing, and may have no line
        seen.spans = await asyncio.to_thread(
            sink.wait_for,
            lambda spans: all(
                check_trace(spans, trace_id, MCP_TOOL) is None
                for trace_id in seen.trace_ids.values()
            ),
            SPANS_BOUND_S,
        )


async def _guard_calls(caller: _Caller, seen: Seen, executions: Path) -> None:
    for path, arguments in (("settled", RAW_MCP_ARGUMENTS), ("full", MCP_ARGUMENTS)):
        trace_id = seen.trace_ids[path] = sampled_trace_id()
        traceparent = f"00-{trace_id}-{secrets.randbits(64) | 1:016x}-01"
        traced = await caller.call(MCP_TOOL, arguments, traceparent=traceparent)
        seen.traced[path] = _final(traced)
    seen.settled = _final(await caller.call(MCP_TOOL, RAW_MCP_ARGUMENTS))
    seen.full = _final(await caller.call(MCP_TOOL, MCP_ARGUMENTS))
    seen.steps = await caller.call(guard_tools.STEPS_TOOL, {"n": STEPS}, progress=True)
    hold: dict[str, object] = {"hold_s": HOLD_S, "key": f"local-{uuid.uuid4().hex}"}
    seen.cancelled = await caller.call(guard_tools.HOLD_TOOL, hold, progress=True, cancel=True)
    seen.cancel_stopped = await _stopped(executions, str(hold["key"]))
    steps: dict[str, object] = {"n": STEPS}
    seen.mcp_steps = await caller.call(guard_tools.MCP_STEPS_TOOL, steps, progress=True)
    hold = {"hold_s": HOLD_S, "key": f"mcp-{uuid.uuid4().hex}"}
    seen.mcp_cancelled = await caller.call(
        guard_tools.MCP_HOLD_TOOL, hold, progress=True, cancel=True
    )
    seen.mcp_cancel_stopped = await _stopped(executions, str(hold["key"]))
    ident = seen.repeat_id = f"guard-repeat-{uuid.uuid4().hex}"
    seen.first = _final(await caller.call(guard_tools.COUNT_TOOL, {"key": ident}, ident=ident))
    again = await caller.call(guard_tools.COUNT_TOOL, {"key": ident}, ident=ident, repeat=True)
    seen.repeat = _final(again)
    await _repeat_while_running(caller, seen)


async def _stopped(executions: Path, key: str) -> bool:
    """Whether the held tool wrote that its cancel reached it, looked for while the
    worker runs (a worker that stops cancels what still holds: that must not count),
    within `REPLY_BOUND_S`. The line may come after the `cancelled` reply (an MCP
    server hears its `notifications/cancelled` after the worker answers)."""
    deadline = asyncio.get_running_loop().time() + REPLY_BOUND_S
    while not guard_tools.stopped(executions, key):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(STOPPED_POLL_S)  # a file another process writes: no event
    return True


async def _repeat_while_running(caller: _Caller, seen: Seen) -> None:
    """The counting tool holding, its id sent again as soon as it says it runs."""
    ident = seen.running_id = f"guard-running-{uuid.uuid4().hex}"
    arguments: dict[str, object] = {"key": ident, "hold_s": REPEAT_HOLD_S}
    repeats: list[asyncio.Task[list[dict[str, Any]]]] = []

    async def again() -> None:
        repeat = caller.call(guard_tools.COUNT_TOOL, arguments, ident=ident, repeat=True)
        repeats.append(asyncio.create_task(repeat))

    first = await caller.call(
        guard_tools.COUNT_TOOL, arguments, ident=ident, progress=True, on_running=again
    )
    seen.running_first = _final(first)
    seen.running_repeat = _final(await repeats[0]) if repeats else {}


def _final(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The final reply, or {} when none came (each check then says what is missing)."""
    return messages[-1] if messages and "ok" in messages[-1] else {}


class _Caller:
    """Requests on `{prefix}/call/{tool}` with an id each, answered on one reply topic
    (read by one task, so a call that times out leaves the next one its messages)."""

    def __init__(self, conn: MqttConnection, prefix: str, reply: str) -> None:
        self.conn, self.prefix, self.reply = conn, prefix, reply
        self.ran: list[str] = []
        self.waiting: dict[bytes, asyncio.Queue[dict[str, Any]]] = {}

    async def read(self, messages: AsyncIterator[Inbound]) -> None:
        async for message in messages:
            queue = self.waiting.get(message.correlation_data or b"")
            if queue is not None:  # else a late message of a call given up on
                queue.put_nowait(json.loads(message.payload))

    async def call(
        self,
        tool: str,
        arguments: dict[str, object],
        *,
        ident: str | None = None,
        progress: bool = False,
        cancel: bool = False,
        on_running: Callable[[], Awaitable[None]] | None = None,
        traceparent: str | None = None,
        repeat: bool = False,
    ) -> list[dict[str, Any]]:
        """Every message the call brought, its updates and then its final reply (none
        within the bound: what came); on its first update, with `cancel` it is
        cancelled, and `on_running` is awaited. A `repeat` of an id is not counted as
        a call that ran."""
        ident = ident or f"guard-{tool}-{uuid.uuid4().hex}"
        if not repeat:
            self.ran.append(ident)
        if cancel:
            on_running = functools.partial(self._cancel, ident)
        body = {"id": ident, "arguments": arguments, **({"progress": True} if progress else {})}
        correlation = uuid.uuid4().bytes
        queue = self.waiting[correlation] = asyncio.Queue()
        await self.conn.publish(
            Outbound(
                topic=f"{self.prefix}/call/{tool}",
                payload=json.dumps(body).encode(),
                response_topic=self.reply,
                correlation_data=correlation,
                user_properties=(("traceparent", traceparent),) if traceparent else (),
            )
        )
        got: list[dict[str, Any]] = []
        with contextlib.suppress(TimeoutError):  # unanswered: the guard says "no final reply"
            async with asyncio.timeout(REPLY_BOUND_S):
                while not got or "ok" not in got[-1]:
                    got.append(await queue.get())
                    running = len(got) == 1 and got[0].get("type") == "progress"
                    if running and on_running is not None:
                        await on_running()
        del self.waiting[correlation]
        return got

    async def _cancel(self, ident: str) -> None:
        """A cancel for our call: no caller named, so its reply topic says whose it is."""
        cancelling = json.dumps({"id": ident}).encode()
        topic = f"{self.prefix}/cancel"
        await self.conn.publish(Outbound(topic, cancelling, response_topic=self.reply))
