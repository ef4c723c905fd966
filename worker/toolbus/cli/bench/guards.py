"""The guards: what the fast paths must keep, checked on what a real worker did.

A speed-up that drops a span, a log line or a check is a regression, however fast it
is; `toolbus bench` therefore runs these once per run (`guard_run.py` makes the calls)
and fails, one line per failed guard, unless `--no-guards`. Each check here is a pure
function of what was seen (spans, replies, the log, an execution count) returning None
when the guard holds and the reason when it does not, so a test can feed it doctored
evidence. Names (`GUARDS`) are what the JSON lists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolbus.cli.bench.span_sink import Span

TRACED_MCP_CALL = "traced-mcp-call"
SETTLED_EQUALS_FULL = "settled-equals-full"
CALL_LINES_AT_INFO = "call-lines-at-info"
PROGRESS = "progress"
MCP_PROGRESS = "mcp-progress"
CANCEL = "cancel"
MCP_CANCEL = "mcp-cancel"
DEDUP_REPEAT = "dedup-repeat"
DEDUP_RUNNING = "dedup-repeat-running"
GUARDS = (
    TRACED_MCP_CALL,
    SETTLED_EQUALS_FULL,
    CALL_LINES_AT_INFO,
    PROGRESS,
    MCP_PROGRESS,
    CANCEL,
    MCP_CANCEL,
    DEDUP_REPEAT,
    DEDUP_RUNNING,
)

OTLP_SERVER, OTLP_CLIENT = 2, 3  # OTLP's SpanKind numbers
# Reply fields that differ between two runs of one call by design: who and when, and the
# normalization the full path reports having done (the settled path has none to report).
PER_RUN_FIELDS = frozenset({"id", "duration_ms", "trace_id", "normalized", "worker_id"})
CALL_EVENT = "call"  # the call line's `event` (toolbus.calls.call_log)


@dataclass(frozen=True, slots=True)
class GuardResult:
    name: str
    ok: bool
    detail: str  # what was seen when it holds; why not when it does not

    def line(self) -> str:
        return f"guard {self.name}: {'ok' if self.ok else 'FAILED'}: {self.detail}"


def outcome(reply: Mapping[str, Any]) -> str:
    """`ok`, the error's code, or `no reply` ({}: none came within the bound)."""
    if not reply:
        return "no reply"
    if reply.get("ok") is True:
        return "ok"
    error = reply.get("error")
    return str(error.get("code")) if isinstance(error, dict) else "not ok, without a code"


def check_trace(spans: Iterable[Span], trace_id: str, tool: str) -> str | None:
    """The worker's `tools/call {tool}` CLIENT span and the MCP server's SERVER span of
    the same name in the caller's trace, the server's beneath the client's (through the
    spans between them, the SDK's own when it records one)."""
    mine = {s.span_id: s for s in spans if s.trace_id == trace_id}
    name = f"tools/call {tool}"
    clients = [s for s in mine.values() if s.name == name and s.kind == OTLP_CLIENT]
    servers = [s for s in mine.values() if s.name == name and s.kind == OTLP_SERVER]
    if not clients:
        return f"no CLIENT span {name!r} in trace {trace_id} ({len(mine)} spans of it)"
    if not servers:
        return f"no SERVER span {name!r} from the MCP server in trace {trace_id}"
    client_ids = {c.span_id for c in clients}
    for server in servers:
        if server.service in {c.service for c in clients}:
            continue  # the worker's own: not the server's
        seen, parent = set(), server.parent_span_id
        while parent and parent not in seen:  # up the tree, a cycle never followed twice
            if parent in client_ids:
                return None
            seen.add(parent)
            parent = mine[parent].parent_span_id if parent in mine else ""
    return f"the MCP server's span {name!r} is not beneath the worker's CLIENT span"


def comparable(reply: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reply.items() if k not in PER_RUN_FIELDS}


def check_same_reply(settled: Mapping[str, Any], full: Mapping[str, Any]) -> str | None:
    """The same call in the schema's shape (settled path) and in one that needs
    normalizing (full path): both `ok`, the full one having normalized something, and
    the same reply once the per-run fields are left out."""
    if settled.get("ok") is not True or full.get("ok") is not True:
        return f"not both ok: settled {outcome(settled)}, full {outcome(full)}"
    if settled.get("normalized"):
        return f"the settled call was normalized: {settled['normalized']}"
    if not full.get("normalized"):
        return "the call to normalize was not normalized (no `normalized` entries)"
    a, b = comparable(settled), comparable(full)
    if a != b:
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        return f"the replies differ in {', '.join(differ)}"
    return None


def call_lines(log_text: str) -> dict[str, str]:
    """call id -> outcome, from the JSON call lines of a worker's log."""
    found: dict[str, str] = {}
    for text in log_text.splitlines():
        if not text.startswith("{"):
            continue
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("message", line.get("event")) == CALL_EVENT:
            found[str(line.get("call_id"))] = str(line.get("outcome"))
    return found


def check_call_lines(log_text: str, call_ids: Sequence[str]) -> str | None:
    """Every call that ran has its call line in the log (log level INFO)."""
    found = call_lines(log_text)
    missing = [ident for ident in call_ids if ident not in found]
    if missing:
        return f"{len(missing)} of {len(call_ids)} calls have no call line: {', '.join(missing)}"
    return None


def check_progress(messages: Sequence[Mapping[str, Any]], steps: int) -> str | None:
    """Updates 1..steps, in order, each before the one final reply, which is `ok`."""
    if not messages or "ok" not in messages[-1]:
        return "no final reply"
    *updates, reply = messages
    if reply.get("ok") is not True:
        return f"the call ended {outcome(reply)}"
    kinds = {m.get("type") for m in updates}
    if kinds - {"progress"}:
        return f"not progress before the reply: {sorted(map(str, kinds))}"
    seen = [m.get("progress") for m in updates]
    if seen != list(range(1, steps + 1)):
        return f"progress {seen}, not 1..{steps}"
    return None


def check_cancel(messages: Sequence[Mapping[str, Any]], *, stopped: bool) -> str | None:
    """A call cancelled while it ran (its first update seen) ends as `cancelled`, and
    its tool stopped (`stopped`: the tool saw the cancel), not only its reply."""
    if not messages or "ok" not in messages[-1]:
        return "no final reply"
    reply = messages[-1]
    if outcome(reply) != "cancelled":
        return f"ended {outcome(reply)}, not cancelled"
    if not any(m.get("type") == "progress" for m in messages[:-1]):
        return "it was never seen running"
    if not stopped:
        return "answered `cancelled`, but the cancel never reached the tool: it runs on"
    return None


def check_dedup(first: Mapping[str, Any], repeat: Mapping[str, Any], executions: int) -> str | None:
    """The same request (same id) sent twice, the second after the first's reply or
    while the first runs: the tool ran once, the repeat got the first's result marked
    `replayed`."""
    if first.get("ok") is not True:
        return f"the call ended {outcome(first)}"
    if executions != 1:
        return f"the tool ran {executions} times for one id"
    if repeat.get("replayed") is not True:
        return "the repeat's reply is not marked replayed"
    if repeat.get("result") != first.get("result"):
        return "the repeat's result differs from the first's"
    return None


def result(name: str, failure: str | None, held: str) -> GuardResult:
    return GuardResult(name, failure is None, held if failure is None else failure)
