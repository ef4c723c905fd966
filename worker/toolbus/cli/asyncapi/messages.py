"""The messages on our topics, as AsyncAPI Message Objects (`components/messages`).

Requests: our envelope and each provider's shapes (`providers.py`); replies: a `Reply`,
a `CallsReply` in our format or a provider's, a tool listing; and the trace, dead-letter
and status messages. MQTT v5 properties are in each message's `mqtt` binding; the user
properties we read or write are its headers.
"""

from __future__ import annotations

from typing import Any

from toolbus.cli.asyncapi import examples
from toolbus.cli.asyncapi.providers import APPENDED, DEFINITIONS, REQUESTS
from toolbus.cli.asyncapi.wire import COMPONENT_SCHEMAS, wire_ref
from toolbus.doors.envelope.decode import PROGRESS_PROPERTY, PUBLISH_TRACE_PROPERTY
from toolbus.observability.propagation import MAX_BAGGAGE_CHARS, MAX_HEADER_CHARS
from toolbus.wire.contracts import ReplyFormat
from toolbus.wire.untrusted import MAX_ECHO_BYTES

BINDING_VERSION = "0.2.0"  # of the AsyncAPI MQTT bindings
CONTENT_TYPE = "application/json"
TRACE_ID_PROPERTY = "toolbus-id"  # on `{reply}/trace`: the call whose spans these are

Message = dict[str, Any]

_CORRELATION_DATA = {
    "type": "string",
    "format": "binary",
    "maxLength": MAX_ECHO_BYTES,
    "description": "MQTT v5 Correlation Data: any bytes, echoed unchanged on the reply "
    f"(up to {MAX_ECHO_BYTES} bytes; longer is `bad_request`).",
}
_TRACE_CONTEXT = {
    "traceparent": {"type": "string", "maxLength": MAX_HEADER_CHARS},
    "tracestate": {"type": "string", "maxLength": MAX_HEADER_CHARS},
    "baggage": {"type": "string", "maxLength": MAX_BAGGAGE_CHARS},
}
_REQUEST_HEADERS = {
    "type": "object",
    "description": "MQTT v5 user properties. W3C trace context and baggage (`traceparent`, "
    "`tracestate`, `baggage`; MQTT 3.1.1 callers put them in the body), and "
    f"`{PUBLISH_TRACE_PROPERTY}: 1` to have the call's spans published on "
    f"`{{reply_topic}}/trace`; `{PROGRESS_PROPERTY}: 1` to get its progress updates.",
    "properties": {
        **_TRACE_CONTEXT,
        PUBLISH_TRACE_PROPERTY: {"const": "1"},
        PROGRESS_PROPERTY: {"const": "1"},
    },
}
_REPLY_HEADERS = {
    "type": "object",
    "description": "MQTT v5 user properties: the W3C trace context and baggage of the reply "
    "(MQTT 3.1.1 callers get them in the body).",
    "properties": _TRACE_CONTEXT,
}
_TRACE_HEADERS = {
    "type": "object",
    "description": "MQTT v5 user properties.",
    "required": [TRACE_ID_PROPERTY],
    "properties": {TRACE_ID_PROPERTY: {"type": "string", "description": "The call's id."}},
}
_CORRELATION = {"$ref": COMPONENT_SCHEMAS + "CorrelationData"}
_BINDINGS = "#/components/messageBindings/"


def shared_components() -> dict[str, dict[str, Any]]:
    """What many messages share, by component kind (`schemas`, `messageBindings`) and name."""
    return {
        "schemas": {
            "CorrelationData": _CORRELATION_DATA,
            "RequestHeaders": _REQUEST_HEADERS,
            "ReplyHeaders": _REPLY_HEADERS,
            "TraceHeaders": _TRACE_HEADERS,
        },
        "messageBindings": {
            "request": {
                "mqtt": {
                    "correlationData": _CORRELATION,
                    "responseTopic": {
                        "type": "string",
                        "description": "Where the reply goes (it wins over the body's "
                        "`reply_to`): under an allowed reply prefix (`reply_prefixes`, "
                        "default `{prefix}/reply/`), never a request, dead-letter or status "
                        "topic; in `topic` identity mode under `{reply_prefix}{caller}/`. "
                        "Anything else is `forbidden` and dead-lettered.",
                    },
                    "contentType": CONTENT_TYPE,
                    "bindingVersion": BINDING_VERSION,
                }
            },
            "reply": {
                "mqtt": {
                    "correlationData": _CORRELATION,
                    "contentType": CONTENT_TYPE,
                    "bindingVersion": BINDING_VERSION,
                }
            },
            "plain": {"mqtt": {"contentType": CONTENT_TYPE, "bindingVersion": BINDING_VERSION}},
        },
    }


_BY_ID = {
    "description": "MQTT v5 callers match on Correlation Data (see the mqtt binding); MQTT "
    "3.1.1 callers on `id`, the request's own or a generated one.",
    "location": "$message.payload#/id",
}

_PROVIDER_NAMES = {
    ReplyFormat.ANTHROPIC: ("anthropic", "Anthropic Messages"),
    ReplyFormat.OPENAI: ("openaiChat", "OpenAI Chat Completions"),
    ReplyFormat.OPENAI_RESPONSES: ("openaiResponses", "OpenAI Responses"),
    ReplyFormat.OLLAMA: ("ollama", "Ollama"),
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": COMPONENT_SCHEMAS + name}


def _examples(examples: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": name, "payload": payload} for name, payload in examples]


def _request(title: str, summary: str, payload: dict[str, Any], **extra: Any) -> Message:
    return {
        "title": title,
        "summary": summary,
        "contentType": CONTENT_TYPE,
        "headers": {"$ref": COMPONENT_SCHEMAS + "RequestHeaders"},
        "payload": payload,
        "bindings": {"$ref": _BINDINGS + "request"},
        **extra,
    }


def _reply(title: str, summary: str, payload: dict[str, Any]) -> Message:
    return {
        "title": title,
        "summary": summary,
        "contentType": CONTENT_TYPE,
        "headers": {"$ref": COMPONENT_SCHEMAS + "ReplyHeaders"},
        "payload": payload,
        "correlationId": _BY_ID,
        "bindings": {"$ref": _BINDINGS + "reply"},
    }


def request_messages() -> dict[str, Message]:
    """Key -> message: every shape a call may arrive in (the call topics take them all)."""
    messages = {
        "envelope": _request(
            "toolbus envelope",
            "A tool call in our own shape: `tool` (unless the topic names it), `arguments`, "
            "and options at the top level or under `toolbus`.",
            wire_ref("request"),
            correlationId=_BY_ID,
            examples=_examples(examples.ENVELOPE),
        )
    }
    for fmt, shapes in REQUESTS.items():
        key, title = _PROVIDER_NAMES[fmt]
        messages[f"{key}Calls"] = _request(
            f"{title} tool calls",
            f"Tool calls as the {title} SDK emits them, published as they are; answered "
            f"in the `{fmt.value}` format unless `toolbus.reply_format` says otherwise.",
            {"oneOf": [_ref(name) for name in shapes]},
            examples=_examples(examples.PROVIDERS[fmt]),
        )
    return messages


def tools_request() -> Message:
    return _request(
        "tools request",
        "Asks for the tool definitions the caller may use; `format` (or `toolbus.format`) "
        "names their shape.",
        wire_ref("request"),
        correlationId=_BY_ID,
        examples=_examples(examples.TOOLS_REQUEST),
    )


def task_get_request() -> Message:
    return _request(
        "tasks/get request",
        "Asks how a task stands, by the `task_id` its first reply gave; only the caller "
        "that started it is told (anyone else: `unknown_task`).",
        wire_ref("task-get"),
        correlationId=_BY_ID,
    )


def reply_messages() -> dict[str, Message]:
    """Key -> message: every answer on a caller's reply topic."""
    messages = {
        "reply": _reply(
            "Reply",
            "The answer to one call in our format, and the refusal of a whole message. A "
            "call whose tool asks its caller (the request said `input`) answers a round "
            "`input_required`: its questions and a `continuation` token, which a new "
            "request answers; one a person must approve answers `approval_required`.",
            wire_ref("reply"),
        ),
        "toolsReply": _reply(
            "tools reply",
            "The answer to a tools request: a `Reply` whose `result.structured` is "
            '`{"tools": [...], "pending": [...]}`: the definitions in the asked `format` '
            "(`result.text`: the names), and the MCP servers not ready when it was made "
            "(a list asked while they connect waits for them within its deadline); for a "
            "provider's format, `mcp`: the MCP fields its definitions have no place for.",
            {"allOf": [wire_ref("reply"), _listing()]},
        ),
        "progress": {
            **_reply(
                "Progress",
                "One progress update of a running call, when the request asked (`progress`, "
                f"or the user property `{PROGRESS_PROPERTY}: 1`): before the reply, in "
                "order, with the request's Correlation Data and the call's `id` (each "
                "call's own in a message of many). It has no `ok`: the reply is the one "
                "message that does. At most `progress_rate_per_s` a second per call; the "
                "last before the reply is always sent.",
                wire_ref("progress"),
            ),
            "headers": {"type": "object"},  # none: progress carries no trace context
        },
        "taskState": _reply(
            "TaskState",
            "A call run as a task (`task: true`, or the tool's `task = true`): its first "
            "reply (`status: working`, no `ok`), each status change, and `tasks/get`'s "
            "answer while it runs. Its end is a `Reply` with `task_id` and `status`.",
            wire_ref("task-state"),
        ),
        "callsReply": _reply(
            "CallsReply",
            "The answer to a message of many calls in our format: each call's `Reply`, in "
            "order, once all have finished.",
            wire_ref("calls-reply"),
        ),
    }
    for fmt, (item, _) in APPENDED.items():
        key, title = _PROVIDER_NAMES[fmt]
        messages[f"{key}Reply"] = _reply(
            f"{title} reply",
            f"A `CallsReply` in the `{fmt.value}` format: `append` is what to append to the "
            f"{title} conversation as it is; `results` each call's `Reply` (without its "
            "`result`, which is in `append`).",
            {
                "allOf": [
                    wire_ref("calls-reply"),
                    {
                        "properties": {
                            "format": {"const": fmt.value},
                            "append": {"type": "array", "items": _ref(item)},
                        }
                    },
                ]
            },
        )
    return messages


def _listing() -> dict[str, Any]:
    """`result.structured` of a tools reply: our `ToolList`, or a provider's definitions."""
    provided = sorted({name for name, _ in DEFINITIONS.values()})
    tools = {"type": "array", "items": {"oneOf": [_ref(name) for name in provided]}}
    # Beside a provider's definitions, our word on what the list may lack (`ToolList`'s).
    pending = {"type": "array", "items": _ref("PendingServer")}
    # Provider name -> the MCP fields (`outputSchema`, `annotations`, `execution`) the
    # provider's definitions have no place for.
    mcp = {"type": "object", "additionalProperties": {"type": "object"}}
    theirs = {
        "type": "object",
        "required": ["tools"],
        "properties": {"tools": tools, "pending": pending, "mcp": mcp},
    }
    # anyOf: our definitions are MCP's and more, so ours also pass as MCP's.
    structured = {"anyOf": [wire_ref("tool-list"), theirs]}
    return {"properties": {"result": {"properties": {"structured": structured}}}}


def trace_message() -> Message:
    return {
        "title": "the call's spans",
        "summary": "The spans the worker recorded for one call, as OTLP/JSON.",
        "description": "An OpenTelemetry `ExportTraceServiceRequest` in the OTLP/JSON "
        "encoding (hex trace and span ids, integer enums), published after the reply with "
        "the request's Correlation Data.",
        "contentType": CONTENT_TYPE,
        "headers": {"$ref": COMPONENT_SCHEMAS + "TraceHeaders"},
        "payload": {
            "type": "object",
            "required": ["resourceSpans"],
            "properties": {"resourceSpans": {"type": "array", "items": {"type": "object"}}},
        },
        "bindings": {"$ref": _BINDINGS + "reply"},
        "externalDocs": {
            "description": "OTLP/JSON",
            "url": "https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding",
        },
    }


def operator_messages() -> dict[str, Message]:
    """Key -> message: dead letters and statuses."""
    return {
        "deadLetter": {
            "title": "DeadLetter",
            "summary": "A request that could not be answered (no usable reply address), with "
            "the error it got and the start of its payload.",
            "contentType": CONTENT_TYPE,
            "payload": wire_ref("dead-letter"),
            "bindings": {"$ref": _BINDINGS + "plain"},
        },
        "workerStatus": {
            "title": "WorkerStatus",
            "summary": "A worker's state; `offline` is also its MQTT last will.",
            "contentType": CONTENT_TYPE,
            "payload": wire_ref("worker-status"),
            "bindings": {"$ref": _BINDINGS + "plain"},
        },
        "serverStatus": {
            "title": "ServerStatus",
            "summary": "One MCP server's state as one worker sees it: last error and tools.",
            "contentType": CONTENT_TYPE,
            "payload": wire_ref("server-status"),
            "bindings": {"$ref": _BINDINGS + "plain"},
        },
    }


def cancel_message() -> Message:
    """A caller's cancel of its call (`doors/envelope/cancel.py`)."""
    return {
        "title": "Cancel",
        "summary": "Cancel the call with this id: only the caller that made it can.",
        "description": "The call is named as its dedup key names it: by `caller` (the "
        "body's, in `claim` mode, or the topic's) and `id`; a client without a caller adds "
        "the call's reply topic (the same Response Topic, or `reply_to`). Never answered: "
        "the call's own final reply is `cancelled` (`details.started`, `in_doubt`, "
        "`cause`). One that comes before its call is remembered for `cancel_remember_s`.",
        "contentType": CONTENT_TYPE,
        "payload": {
            "type": "object",
            "required": ["id"],
            "properties": {
                "id": {"type": "string", "minLength": 1, "description": "The call's id."},
                "caller": {"type": "string", "description": "`claim` mode: who made it."},
                "reply_to": {
                    "type": "string",
                    "description": "A caller without a name: the call's reply topic.",
                },
            },
        },
        "bindings": {"$ref": _BINDINGS + "plain"},
        "examples": _examples(
            [
                ("named", {"id": "req-42", "caller": "kitchen"}),
                ("anonymous", {"id": "req-42", "reply_to": "toolbus/reply/my-client"}),
            ]
        ),
    }
