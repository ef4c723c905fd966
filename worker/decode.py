"""Decode: an MQTT message becomes a `Call`, or a `Rejected` that says why.

Accepted bodies (JSON objects):
- the toolbus envelope `{id, tool, arguments, reply_to, caller, timeout_s, deadline_ms}`;
- an Anthropic `tool_use` block `{type: "tool_use", id, name, input}`;
- an OpenAI/Ollama tool call `{id, type: "function", function: {name, arguments}}`
  (arguments as an object or a JSON string), or a message holding exactly one
  of them in `tool_calls`.
Envelope fields (`reply_to`, `caller`, `timeout_s`, `deadline_ms`) may sit beside either
AI shape.

When the sender stops waiting travels with the call: the MQTT v5 Message Expiry Interval
(what remains of it when the broker hands the message over) and the body's absolute
`deadline_ms` (for MQTT 3.1.1 callers), whichever comes first, as a `time.monotonic()`
instant on the call (`deadline_at`) and on its reply address (`expires_at`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from toolbus.contracts import Request
from toolbus.errors import BadRequest, Forbidden, ToolbusError
from toolbus.messages import Inbound
from toolbus.topics import Topics

PUBLISH_TRACE_PROPERTY = "toolbus-publish-trace"

# Bounds on what a refusal echoes back: a hostile body must not make a huge reply.
MAX_PATH_CHARS = 200
MAX_REPORTED_ERRORS = 20


@dataclass(frozen=True, slots=True)
class ReplyAddress:
    topic: str
    correlation_data: bytes | None = None
    expires_at: float | None = None  # time.monotonic() after which the sender stops listening


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    tool: str
    arguments: dict[str, Any]
    topic: str
    reply: ReplyAddress | None = None
    id_generated: bool = False
    caller: str | None = None
    timeout_s: float | None = None
    list_tools: bool = False
    topic_path: bool = False  # the tool came from the topic (and may be `caller/tool`)
    payload_bytes: int = 0  # size of the message that carried the call
    trace_fields: dict[str, str] = field(default_factory=dict)  # body traceparent/tracestate
    publish_trace: bool = False
    user_properties: tuple[tuple[str, str], ...] = field(default=())
    deadline_at: float | None = None  # time.monotonic() after which the sender stops caring


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that cannot become a call; answered or dead-lettered as it is."""

    error: ToolbusError
    topic: str
    payload: bytes
    id: str
    reply: ReplyAddress | None = None
    id_generated: bool = False


def decode(message: Inbound, topics: Topics, max_payload_bytes: int) -> Call | Rejected:
    body: dict[str, Any] | None = None
    reply = _v5_reply(message)
    try:
        if len(message.payload) > max_payload_bytes:
            raise BadRequest(
                f"payload of {len(message.payload)} bytes exceeds the limit of {max_payload_bytes}",
                limit_bytes=max_payload_bytes,
                size_bytes=len(message.payload),
            )
        body = _parse_object(message.payload)
        if reply is None and isinstance(body.get("reply_to"), str):
            reply = ReplyAddress(body["reply_to"], expires_at=_expiry_at(message))
        if reply is not None and not topics.reply_allowed(reply.topic):
            bad_topic = reply.topic
            reply = None
            raise Forbidden(
                "reply topic is outside the allowed reply prefixes",
                allowed_prefixes=list(topics.reply_prefixes),
                reply_topic=bad_topic[:200],
            )
        request = _request(_envelope(body))
        return _call(message, topics, request, reply)
    except ToolbusError as error:
        raw_id = body.get("id") if body is not None else None
        ident, generated = (raw_id, False) if isinstance(raw_id, str) else (_new_id(), True)
        return Rejected(error, message.topic, message.payload, ident, reply, generated)


def _v5_reply(message: Inbound) -> ReplyAddress | None:
    if message.response_topic is None:
        return None
    return ReplyAddress(message.response_topic, message.correlation_data, _expiry_at(message))


def _expiry_at(message: Inbound) -> float | None:
    if message.expiry_s is None:
        return None
    return message.received_at + message.expiry_s


def _deadline_at(message: Inbound, request: Request) -> float | None:
    """The first of the message's expiry and the body's wall-clock `deadline_ms`."""
    instants = [at for at in (_expiry_at(message),) if at is not None]
    if request.deadline_ms is not None:
        instants.append(time.monotonic() + request.deadline_ms / 1000 - time.time())
    return min(instants, default=None)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_object(payload: bytes) -> dict[str, Any]:
    try:
        # Strict JSON: Python would otherwise accept NaN and Infinity.
        body = json.loads(payload, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"payload is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("payload is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"payload must be a JSON object, got {type(body).__name__}")
    return body


def _envelope(body: dict[str, Any]) -> dict[str, Any]:
    """Map the AI-client shapes onto the toolbus envelope."""
    if "tool_calls" in body:
        calls = body["tool_calls"]
        if not isinstance(calls, list) or len(calls) != 1:
            raise BadRequest("`tool_calls` must hold exactly one call per message")
        return _envelope({**{k: v for k, v in body.items() if k != "tool_calls"}, **calls[0]})
    if body.get("type") == "tool_use":
        return {**body, "tool": body.get("name"), "arguments": body.get("input", {})}
    function = body.get("function")
    if isinstance(function, dict):
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise BadRequest("`function.arguments` is not valid JSON") from None
        return {**body, "tool": function.get("name"), "arguments": arguments}
    return body


def _request(body: dict[str, Any]) -> Request:
    try:
        return Request.model_validate(body)
    except RecursionError:
        raise BadRequest("arguments are nested too deeply") from None
    except ValidationError as exc:
        problems = [
            {"path": ".".join(str(p) for p in err["loc"])[:MAX_PATH_CHARS], "problem": err["msg"]}
            for err in exc.errors(include_url=False, include_input=False)[:MAX_REPORTED_ERRORS]
        ]
        raise BadRequest("request envelope is invalid", errors=problems) from None


def _call(message: Inbound, topics: Topics, request: Request, reply: ReplyAddress | None) -> Call:
    caller = request.caller
    from_topic: str | None = None
    if topics.is_tools_request(message.topic):
        tool = ""
        list_tools = True
        topic_caller = topics.caller_from_tools_topic(message.topic)
        if topic_caller and caller and topic_caller != caller:
            raise BadRequest("the topic and the body name different callers")
        caller = topic_caller or caller
    else:
        from_topic = topics.tool_from_topic(message.topic)
        if from_topic is None:
            raise BadRequest(f"not a request topic: {message.topic}")
        if (
            from_topic
            and request.tool
            and from_topic != request.tool
            and not from_topic.endswith("/" + request.tool)
        ):
            raise BadRequest("the topic and the body name different tools")
        tool = from_topic or request.tool or ""
        if not tool:
            raise BadRequest("request names no tool: use `{prefix}/call/{tool}` or a `tool` field")
        list_tools = False
    ident, generated = (request.id, False) if request.id else (_new_id(), True)
    deadline_at = _deadline_at(message, request)
    if reply is not None and deadline_at is not None:
        reply = replace(reply, expires_at=deadline_at)
    return Call(
        id=ident,
        id_generated=generated,
        tool=tool,
        arguments=dict(request.arguments),
        topic=message.topic,
        reply=reply,
        caller=caller,
        timeout_s=request.timeout_s,
        list_tools=list_tools,
        topic_path=bool(from_topic),
        payload_bytes=len(message.payload),
        publish_trace=request.publish_trace
        or any(
            k == PUBLISH_TRACE_PROPERTY and v.lower() in ("1", "true")
            for k, v in message.user_properties
        ),
        trace_fields={
            k: v
            for k, v in (("traceparent", request.traceparent), ("tracestate", request.tracestate))
            if v
        },
        user_properties=message.user_properties,
        deadline_at=deadline_at,
    )


def _new_id() -> str:
    return str(uuid.uuid4())
