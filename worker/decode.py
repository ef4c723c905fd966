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

Whatever the caller sent that the worker would publish to or echo is checked here, before
anything runs (`toolbus.untrusted`): the reply topic (a valid topic, under the caller's
reply space), the correlation data (bounded), the id and caller (printable), every string
of the body (no lone surrogates). A bad reply topic leaves the request without a reply
address, so it is dead-lettered; any other refusal is answered.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from toolbus.contracts import Request, ToolsFormat
from toolbus.errors import BadRequest, Forbidden, ToolbusError
from toolbus.messages import Inbound
from toolbus.topics import Route, Topics
from toolbus.untrusted import (
    MAX_ECHO_BYTES,
    may_hold_surrogates,
    shown,
    surrogate_path,
    text_problem,
)

PUBLISH_TRACE_PROPERTY = "toolbus-publish-trace"

# Bounds on what a refusal echoes back: a hostile body must not make a huge reply.
MAX_PATH_CHARS = 200
MAX_REPORTED_ERRORS = 20
MAX_ID_CHARS = 200


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
    tools_format: ToolsFormat = ToolsFormat.TOOLBUS  # on `{prefix}/tools`: the definitions' shape


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
    reply: ReplyAddress | None = None
    try:
        route = topics.route(message.topic)
        # Only the topic can say who the caller is before the body is read; in `claim`
        # mode replies are not scoped to callers, so the body's claim is not needed here.
        reply = _reply_address(message, topics, route.caller if isinstance(route, Route) else None)
        if len(message.payload) > max_payload_bytes:
            raise BadRequest(
                f"payload of {len(message.payload)} bytes exceeds the limit of {max_payload_bytes}",
                limit_bytes=max_payload_bytes,
                size_bytes=len(message.payload),
            )
        body = _parse_object(message.payload)
        if reply is None and "reply_to" in body:
            reply = _body_reply(message, topics, route, body["reply_to"])
        if isinstance(route, str):
            raise BadRequest(f"not a request topic: {shown(message.topic)}", reason=route)
        envelope = _envelope(body)
        # Escapes are the only way in, once the payload is UTF-8. The envelope holds every
        # field the worker reads (a string `function.arguments` parsed, too).
        if may_hold_surrogates(message.payload):
            _refuse_surrogates(envelope)
        request = _request(envelope)
        return _call(message, topics, route, request, reply)
    except ToolbusError as error:
        raw_id = body.get("id") if body is not None else None
        if isinstance(raw_id, str) and _id_problem(raw_id) is None:
            ident, generated = raw_id, False
        else:
            ident, generated = _new_id(), True
        return Rejected(error, message.topic, message.payload, ident, reply, generated)


def _refuse_surrogates(body: dict[str, Any]) -> None:
    """Nothing could carry a lone surrogate further: not the reply, not an MCP server."""
    try:
        where = surrogate_path(body)
    except RecursionError:
        raise BadRequest("payload is nested too deeply") from None
    if where is not None:
        raise BadRequest("a string holds a lone UTF-16 surrogate", reason="surrogate", path=where)


def _reply_address(message: Inbound, topics: Topics, caller: str | None) -> ReplyAddress | None:
    """The v5 reply address, once checked: a bad one raises with no address at all."""
    if message.response_topic is None:
        return None
    _check_reply_topic(topics, message.response_topic, caller)
    data = message.correlation_data
    if data is not None and len(data) > MAX_ECHO_BYTES:
        raise BadRequest(
            "correlation data is too long to echo",
            reason="correlation_data_too_long",
            limit_bytes=MAX_ECHO_BYTES,
            size_bytes=len(data),
        )
    return ReplyAddress(message.response_topic, data, _expiry_at(message))


def _body_reply(
    message: Inbound, topics: Topics, route: Route | str, reply_to: object
) -> ReplyAddress | None:
    """A 3.1.1 caller's `reply_to`, once checked (the envelope model reports a wrong type)."""
    if not isinstance(reply_to, str):
        return None
    _check_reply_topic(topics, reply_to, route.caller if isinstance(route, Route) else None)
    return ReplyAddress(reply_to, expires_at=_expiry_at(message))


def _check_reply_topic(topics: Topics, topic: str, caller: str | None) -> None:
    """Any reply topic we will not publish to is `forbidden`; `details.reason` says why."""
    problem = topics.reply_problem(topic, caller)
    if problem is not None:
        raise Forbidden(
            "reply topic is not one a reply may be published to",
            reason=problem,
            reply_topic=shown(topic),
            allowed_prefixes=list(topics.reply_space(caller)),
        )


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
        # Strict UTF-8 first: `json.loads(bytes)` would also take UTF-16 and UTF-32, and
        # surrogates encoded as UTF-8 bytes, which no reply could carry back.
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"payload is not UTF-8: {exc.reason} at byte {exc.start}") from None
    body = _json(text, "payload")
    if not isinstance(body, dict):
        raise BadRequest(f"payload must be a JSON object, got {type(body).__name__}")
    return body


# Made once: `json.loads` with an argument builds a new decoder for every call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _json(text: str, what: str) -> Any:
    """Strict JSON (Python would otherwise accept NaN and Infinity), bounded in depth."""
    try:
        return _DECODER.decode(text)
    except ValueError as exc:
        raise BadRequest(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(f"{what} is nested too deeply") from None


def _envelope(body: dict[str, Any]) -> dict[str, Any]:
    """Map the AI-client shapes onto the toolbus envelope."""
    if "tool_calls" in body:
        calls = body["tool_calls"]
        if not isinstance(calls, list) or len(calls) != 1:
            raise BadRequest("`tool_calls` must hold exactly one call per message")
        if not isinstance(calls[0], dict):
            raise BadRequest("each of `tool_calls` must be an object", reason="not_an_object")
        return _envelope({**{k: v for k, v in body.items() if k != "tool_calls"}, **calls[0]})
    if body.get("type") == "tool_use":
        return {**body, "tool": body.get("name"), "arguments": body.get("input", {})}
    function = body.get("function")
    if isinstance(function, dict):
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = _json(arguments, "`function.arguments`") if arguments.strip() else {}
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


def _call(
    message: Inbound, topics: Topics, route: Route, request: Request, reply: ReplyAddress | None
) -> Call:
    caller = _caller(topics, route, request)
    if request.id is not None and (problem := _id_problem(request.id)) is not None:
        raise BadRequest("the request id cannot be echoed", reason=problem)
    if route.list_tools:
        tool = ""
    else:
        named_twice = route.tool and request.tool and route.tool != request.tool
        if named_twice and not (route.ambiguous and route.tool.endswith(f"/{request.tool}")):
            raise BadRequest("the topic and the body name different tools")
        tool = route.tool or request.tool or ""
        if not tool:
            raise BadRequest("request names no tool: use `{prefix}/call/{tool}` or a `tool` field")
        if text_problem(tool) is not None:
            raise BadRequest("the tool name cannot be echoed", reason="bad_character")
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
        list_tools=route.list_tools,
        topic_path=route.ambiguous,
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
        tools_format=request.format
        or (request.toolbus.format if request.toolbus else None)
        or ToolsFormat.TOOLBUS,
    )


def _caller(topics: Topics, route: Route, request: Request) -> str | None:
    """Who is calling: the topic's word in `topic` mode, the request's claim otherwise."""
    claimed = request.caller or None
    if claimed is not None and text_problem(claimed) is not None:
        raise BadRequest("the caller name cannot be echoed", reason="bad_character")
    if topics.caller_identity == "topic":
        if claimed is not None and claimed != route.caller:
            raise Forbidden("the body names a caller the topic does not", reason="caller_mismatch")
        caller = route.caller
    else:
        if route.caller and claimed and route.caller != claimed:
            raise BadRequest("the topic and the body name different callers")
        caller = route.caller or claimed
    # `call/{a}/{b}` in claim mode may name caller `a`: the pipeline decides once the
    # registry says whether `a/b` is a tool, and checks `require_caller` then.
    if caller is None and topics.require_caller and not route.ambiguous:
        raise Forbidden("this worker answers only named callers", reason="caller_required")
    return caller


def _id_problem(ident: str) -> str | None:
    if len(ident) > MAX_ID_CHARS:
        return "too_long"
    return text_problem(ident)


def _new_id() -> str:
    return str(uuid.uuid4())
