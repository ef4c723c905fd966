"""Wire contracts: every payload that crosses MQTT, as pydantic models.

`schemas/*.json` are rendered from these models by `toolbus schemas --write`;
`toolbus schemas --check` fails when the files drift from the code.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, JsonValue

from toolbus.wire.asking import Asking
from toolbus.wire.model import TRACE_UNAVAILABLE, TraceUnavailable
from toolbus.wire.model import McpServerState as McpServerState  # noqa: PLC0414 -- re-exported
from toolbus.wire.model import WireModel as _Wire
from toolbus.wire.progress import Progress as Progress  # noqa: PLC0414 -- re-exported
from toolbus.wire.progress import Steering
from toolbus.wire.task_wire import TASK_MODELS

# The tool list's models, imported from here as they always were (re-exported).
from toolbus.wire.tool_list import PendingServer as PendingServer  # noqa: PLC0414 -- see above
from toolbus.wire.tool_list import ToolDefinition as ToolDefinition  # noqa: PLC0414 -- see above
from toolbus.wire.tool_list import ToolList as ToolList  # noqa: PLC0414 -- see above

SCHEMA_VERSION = 1


class ErrorCode(StrEnum):
    """Stable error codes. Callers branch on these; never rename one."""

    BAD_REQUEST = "bad_request"
    """The message could not be read as a request (not JSON, not an object, no tool, too big)."""
    UNKNOWN_TOOL = "unknown_tool"
    """No tool by that name; `details.candidates` lists the closest names."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """The arguments do not satisfy the tool's schema; `details.errors` lists each problem."""
    FORBIDDEN = "forbidden"
    """The request asked for what it may not have (e.g. a reply topic outside the allowed ones)."""
    TIMEOUT = "timeout"
    """The tool did not finish within its deadline; the call was cancelled."""
    UNAVAILABLE = "unavailable"
    """The backend serving the tool cannot be reached, or the worker is shutting down."""
    TOOL_ERROR = "tool_error"
    """The tool ran and failed; `message` carries its own text."""
    INTERNAL = "internal"
    """A bug in the worker. Logged with its context."""
    IN_DOUBT = "in_doubt"
    """A repeat of a request whose first run was cut short (its worker died): it may or may
    not have taken effect, and the tool is not safe to run again."""
    RATE_LIMITED = "rate_limited"
    """The caller is over its quota (`[callers.NAME]` rate or calls in flight); nothing ran.
    `details.retry_after_ms` says when to try again, `details.limit` which quota it hit."""
    REPLY_NOT_KEPT = "reply_not_kept"
    """A repeat of a call that ran, whose reply is no longer kept whole: not run again."""
    CANCELLED = "cancelled"
    """The caller cancelled the call (or its message expired while it ran). `details.started`
    says whether the tool had started; `details.in_doubt` that it may have taken effect."""
    UNKNOWN_TASK = "unknown_task"
    """`tasks/get` named no task of this caller's (none, another's, or past `task_ttl_s`)."""
    INPUT_REQUIRED = "input_required"
    """The tool asks its caller first: `details.input_requests`, `details.continuation`."""
    APPROVAL_REQUIRED = "approval_required"
    """A person must approve the call first (nothing ran): `details.approval`, `.call`."""
    CONTINUATION_INVALID = "continuation_invalid"
    """The continuation continues nothing: `details.reason` unknown, used or expired."""
    APPROVAL_INVALID = "approval_invalid"
    """The approval approves nothing: `details.reason` unknown, used, expired, mismatch."""


class ReplyFormat(StrEnum):
    """The shape of a reply: ours, or what a provider's SDK appends to its conversation."""

    TOOLBUS = "toolbus"
    """A `Reply` per call (a `CallsReply` holding them when a message carries many)."""
    ANTHROPIC = "anthropic"
    """A `CallsReply` whose `append` holds one `{"role": "user"}` message of `tool_result`s."""
    OPENAI = "openai"
    """A `CallsReply` whose `append` holds Chat Completions `{"role": "tool"}` messages."""
    OPENAI_RESPONSES = "openai-responses"
    """A `CallsReply` whose `append` holds Responses `function_call_output` items."""
    OLLAMA = "ollama"
    """A `CallsReply` whose `append` holds Ollama `{"role": "tool", "tool_name"}` messages."""


class ToolsFormat(StrEnum):
    """The shape of the tool definitions a request on `{prefix}/tools` gets back."""

    TOOLBUS = "toolbus"
    MCP = "mcp"
    ANTHROPIC = "anthropic"
    OPENAI = "openai"
    OPENAI_RESPONSES = "openai-responses"
    OLLAMA = "ollama"


class Options(Steering, Asking):
    """How to answer a request, under a `toolbus` object beside any provider shape.

    A provider's own fields (an Anthropic block's `caller`, say) never mean anything to
    the worker: its options live here. The plain envelope may also carry them at its top
    level, as it always has.
    """

    id: str | None = Field(
        default=None,
        max_length=200,
        description="The caller's id for this request: the reply's id when the message has "
        "none of its own, and (as `{id}:{n}`) the id of each call that has none (Ollama's), "
        "so a repeat of the request is answered once.",
    )
    reply_to: str | None = Field(
        default=None,
        max_length=1024,
        description="Reply topic for MQTT 3.1.1 callers; MQTT v5 callers use Response Topic.",
    )
    caller: str | None = Field(default=None, max_length=200)
    timeout_s: float | None = Field(default=None, gt=0, description="Deadline for each call.")
    deadline_ms: int | None = Field(
        default=None,
        ge=0,
        le=2**53,  # JSON's exact integers: far enough, and no float overflow
        description=(
            "When the caller stops waiting, as Unix epoch milliseconds (for MQTT 3.1.1 "
            "callers; v5 callers set a Message Expiry Interval). A request past it is not "
            "run: it gets `timeout` with `details.expired`."
        ),
    )
    reply_format: ReplyFormat | None = Field(
        default=None,
        description="The reply's shape; by default the request's own (a provider's shape "
        "gets its provider's format, the envelope `toolbus`).",
    )
    format: ToolsFormat | None = Field(
        default=None,
        description="On `{prefix}/tools`: the shape of the tool definitions (default `toolbus`).",
    )
    traceparent: str | None = Field(
        default=None, max_length=512, description="W3C trace context, for MQTT 3.1.1 callers."
    )
    tracestate: str | None = Field(default=None, max_length=512)
    baggage: str | None = Field(
        default=None, max_length=8192, description="W3C baggage, for MQTT 3.1.1 callers."
    )
    publish_trace: bool | None = Field(
        default=None,
        description="Publish this call's spans as OTLP JSON on `{reply_topic}/trace`.",
    )


class Request(Options):
    """A tool-call request, as published on `{prefix}/call` or `{prefix}/call/{tool}`.

    Its options may also sit under `toolbus`, as every provider shape carries them.
    """

    id: str | None = Field(
        default=None,
        max_length=200,
        description="Correlation ID echoed in the reply; generated when absent.",
    )
    tool: str | None = Field(
        default=None,
        max_length=200,
        description="Tool name; taken from the topic on `{prefix}/call/{tool}`.",
    )
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    toolbus: Options | None = Field(
        default=None,
        description="The options again, as provider shapes carry them; a value given both "
        "here and at the top level must be the same.",
    )


class NormalizationEntry(_Wire):
    """One change normalization made to a request."""

    path: str = Field(description="Where the change happened, e.g. `arguments.device_name`.")
    from_: str = Field(alias="from")
    to: str
    rule: str = Field(description="The rule that made the change, e.g. `static_map`.")


class ContentItem(_Wire):
    """A non-text part of a tool result (image, audio, embedded resource, link)."""

    type: str
    mime_type: str | None = None
    data: str | None = Field(default=None, description="Base64 for binary content.")
    text: str | None = None
    uri: str | None = None
    name: str | None = Field(default=None, description="A resource link's name.")


class ToolResult(_Wire):
    text: str = ""
    structured: JsonValue = Field(default=None, description="Any JSON value (MCP: any, too).")
    content: list[ContentItem] | None = None


class ErrorBody(_Wire):
    code: ErrorCode
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


class Reply(_Wire):
    """The answer to one request, published on the caller's reply topic."""

    id: str
    id_generated: bool = Field(default=False, description="True when the request carried no id.")
    ok: bool
    tool: str | None = Field(default=None, description="Canonical name of the tool executed.")
    result: ToolResult | None = None
    error: ErrorBody | None = None
    duration_ms: float
    normalized: list[NormalizationEntry] = Field(default_factory=list)
    trace_id: str | None = Field(default=None, description="The trace this call belongs to.")
    trace_unavailable: TraceUnavailable | None = Field(default=None, description=TRACE_UNAVAILABLE)
    traceparent: str | None = Field(
        default=None, description="W3C context of the reply, for MQTT 3.1.1 callers."
    )
    tracestate: str | None = Field(
        default=None, description="W3C trace state of the reply, for MQTT 3.1.1 callers."
    )
    baggage: str | None = Field(
        default=None, description="W3C baggage of the reply, for MQTT 3.1.1 callers."
    )
    task_id: str | None = Field(default=None, description="The task this reply ends.")
    status: str | None = Field(default=None, description="The task's final status.")
    replayed: bool = Field(
        default=False,
        description="True when this answers a repeat (the same request id, from the same "
        "caller, asking for the same tool and arguments): the stored reply of its first "
        "run, sent again without running the tool.",
    )


class CallsReply(_Wire):
    """The answer to a message holding tool calls in a provider's shape, or many calls.

    One reply per message, once every call has finished, the calls in the message's order.
    """

    id: str = Field(
        description="The message's own id (`msg_…`, `chatcmpl-…`, `resp_…`) or a generated one."
    )
    id_generated: bool = Field(default=False, description="True when the message had no id.")
    format: ReplyFormat
    ok: bool = Field(description="True when every call succeeded.")
    append: list[dict[str, JsonValue]] = Field(
        default_factory=list,
        description="What to append to the conversation, in `format`: one Anthropic "
        "`user` message of `tool_result` blocks, Chat Completions `tool` messages (and a "
        "`user` message with any images), Responses `function_call_output` items, or "
        "Ollama `tool` messages. Empty for `toolbus`.",
    )
    results: list[Reply] = Field(description="Each call's own reply, in the calls' order.")
    duration_ms: float = Field(description="From the message's arrival to its reply.")
    trace_id: str | None = Field(default=None, description="The trace this message belongs to.")
    trace_unavailable: TraceUnavailable | None = Field(default=None, description=TRACE_UNAVAILABLE)
    traceparent: str | None = Field(
        default=None, description="W3C context of the reply, for MQTT 3.1.1 callers."
    )
    tracestate: str | None = Field(
        default=None, description="W3C trace state of the reply, for MQTT 3.1.1 callers."
    )
    baggage: str | None = Field(
        default=None, description="W3C baggage of the reply, for MQTT 3.1.1 callers."
    )


class DeadLetter(_Wire):
    """A message that could not be answered, published on `{prefix}/dead`."""

    topic: str
    error: ErrorBody
    id: str | None = None
    payload: str = Field(
        description="The original payload's first `dead_letter_max_bytes` bytes, UTF-8 text "
        "or base64 (see encoding); a character cut in half at the bound is left out."
    )
    encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_bytes: int = Field(description="The whole original payload's size.")
    truncated: bool = Field(default=False, description="Not all of the payload is kept.")


class ServerStatus(_Wire):
    """Retained on `{prefix}/status/servers/{server}/{worker_id}`: one MCP server as one
    worker serving it sees it. Republished with the worker's heartbeat, with a Message
    Expiry of a few heartbeats: the status of a worker gone without a word expires."""

    server: str
    state: McpServerState
    worker_id: str
    since: datetime = Field(description="When the server entered this state (ISO 8601, UTC).")
    last_error: str | None = None
    tool_count: int = Field(
        default=0,
        ge=0,
        description="How many tools the server lists; never their names, which a status "
        "would show to every reader, whatever tools their caller profile lets them use.",
    )
    bad_stdout_lines: int = Field(default=0, description="Non-JSON lines the server printed.")
    protocol_version: str | None = Field(default=None, description="The MCP version spoken.")


class ServerSummary(_Wire):
    """One MCP server's state inside a `WorkerStatus`."""

    state: McpServerState
    last_error: str | None = None


class WorkerStatus(_Wire):
    """Retained on `{prefix}/status/workers/{worker_id}`, republished every
    `status_interval_s` with a Message Expiry of a few intervals; `stopping` as a clean
    stop begins (no new request taken), `offline` when it ends and as the MQTT last will
    (whose `since` is null: the broker sends it when the connection is lost, a moment the
    worker cannot know)."""

    state: Literal["online", "stopping", "offline"]
    worker_id: str
    since: datetime | None = Field(
        default=None,
        description="When this state began (ISO 8601, UTC): online since the last connect, "
        "stopping since the stop began, offline since it ended; null on the last will.",
    )
    in_flight: int = Field(default=0, description="Requests being handled now.")
    tasks: int = Field(default=0, description="Calls run as tasks running here now.")
    waiting: int = Field(
        default=0, description="Calls held here waiting for their callers' answers."
    )
    handled: int = Field(
        default=0,
        description="Requests handled since the worker started (a message carrying many "
        "calls counts once); on the last will, as of its last connect.",
    )
    servers: dict[str, ServerSummary] = Field(
        default_factory=dict,
        description="Each MCP server's state; empty on the last will (unknown at a crash).",
    )
    version: str | None = Field(
        default=None, description="The toolbus release the worker runs (`toolbus --version`)."
    )
    broker: str | None = Field(
        default=None,
        description="The broker node (host:port) this status was published on; null on the "
        "last will. On a cluster whose retained messages stay on one node, read it there.",
    )


WIRE_MODELS: dict[str, type[BaseModel]] = {
    "request": Request,
    "reply": Reply,
    "progress": Progress,
    "calls-reply": CallsReply,
    "tool-list": ToolList,
    "dead-letter": DeadLetter,
    "worker-status": WorkerStatus,
    "server-status": ServerStatus,
    **TASK_MODELS,
}


def render_schemas() -> dict[str, str]:
    """File name -> JSON text of every wire model's schema."""
    rendered: dict[str, str] = {}
    for name, model in WIRE_MODELS.items():
        schema: dict[str, Any] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://toolbus.dev/schemas/v{SCHEMA_VERSION}/{name}.json",
            **model.model_json_schema(by_alias=True),
        }
        rendered[f"{name}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return rendered


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, text in render_schemas().items():
        path = directory / file_name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check_schemas(directory: Path) -> list[str]:
    """Names of schema files that are missing or differ from the code."""
    files = {name: (directory / name, text) for name, text in render_schemas().items()}
    return [n for n, (p, text) in files.items() if not p.is_file() or p.read_text("utf-8") != text]
