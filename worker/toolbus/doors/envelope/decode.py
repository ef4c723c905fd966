"""Decode: an MQTT message becomes a `Call`, or a `Rejected` that says why.

Accepted bodies: our envelope `{id, tool, arguments, reply_to, caller, timeout_s, ...}`
and the provider shapes `toolbus.wire.formats.incoming` reads. A provider's message (or an
envelope asking for a provider's `reply_format`) becomes `Calls`, answered in one reply.
Options sit at the envelope's top level or under `toolbus`; beside a provider shape only
under `toolbus`, where they cannot collide with a provider's fields.

When the sender stops waiting travels with the call: the MQTT v5 Message Expiry Interval
or the body's `deadline_ms` (3.1.1), whichever comes first, as a `time.monotonic()` instant
on the call (`deadline_at`) and on its reply address (`expires_at`).

What the worker would publish to or echo is checked here, before anything runs
(`toolbus.wire.untrusted`): the reply topic (valid, in the caller's reply space), the
correlation data (bounded), id and caller (printable), every string (no lone surrogates). A
bad reply topic leaves the request without a reply address (dead-lettered); any other
refusal is answered.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from toolbus.calls.call import Call, ReplyAddress
from toolbus.doors.envelope.addresses import body_address, deadline_at, response_address
from toolbus.doors.envelope.request_bounds import check_bounds
from toolbus.observability.propagation import TRACE_HEADERS
from toolbus.wire.contracts import Options, ReplyFormat, Request, ToolsFormat
from toolbus.wire.errors import BadRequest, Forbidden, ToolbusError
from toolbus.wire.formats import envelope
from toolbus.wire.formats.incoming import (
    ENVELOPE,
    Shape,
    Wanted,
    numbers_as_text,
    read,
    strict_json,
)
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import ANONYMOUS_CALLER, Route, Topics
from toolbus.wire.untrusted import may_hold_surrogates, shown, surrogate_path, text_problem

PUBLISH_TRACE_PROPERTY = "toolbus-publish-trace"
PROGRESS_PROPERTY = "toolbus-progress"
TASK_PROPERTY = "toolbus-task"
INPUT_PROPERTY = "toolbus-input"

# Bounds on what a refusal echoes back: a hostile body must not make a huge reply.
MAX_ID_CHARS = 200
MAX_CALLS = 64  # per message, unless configured (`max_calls_per_message`)


@dataclass(frozen=True, slots=True)
class Calls:
    """A message of provider-shaped calls, or one asking for a provider's reply format:
    every call runs, and one reply answers them all, in the calls' order."""

    id: str
    format: ReplyFormat
    calls: tuple[Call, ...]  # each without a reply address of its own
    topic: str
    reply: ReplyAddress | None = None
    id_generated: bool = False
    trace_fields: dict[str, str] = field(default_factory=dict)
    publish_trace: bool = False


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that cannot become a call; answered or dead-lettered as it is."""

    error: ToolbusError
    topic: str
    payload: bytes
    id: str
    reply: ReplyAddress | None = None
    id_generated: bool = False
    trace_fields: dict[str, str] = field(default_factory=dict)  # as a Call's, when readable


def decode(
    message: Inbound, topics: Topics, max_payload_bytes: int, max_calls: int = MAX_CALLS
) -> Call | Calls | Rejected:
    """The message's call or calls, or why it has none; `max_calls` bounds one message."""
    body: object = None
    reply: ReplyAddress | None = None
    try:
        route = topics.route(message.topic)
        # Only the topic names a caller before the body is read (claim mode needs none).
        reply = response_address(message, topics, topics.caller_of(message.topic))
        check_bounds(message, max_payload_bytes)
        try:
            body = _parse(message.payload)
        except BadRequest:  # a number Python cannot hold: the rest still says where to answer
            body = numbers_as_text(message.payload)
            reply = reply or body_address(message, topics, body, ENVELOPE)
            raise
        try:
            shape = read(body)
        except BadRequest:
            # A 3.1.1 caller still hears why: its `reply_to`, wherever the body put it.
            reply = reply or body_address(message, topics, body, ENVELOPE)
            raise
        if reply is None:
            reply = body_address(message, topics, body, shape)
        if isinstance(route, str):
            raise BadRequest(f"not a request topic: {shown(message.topic)}", reason=route)
        if message.retain:  # it would run again at every (re)subscribe
            raise BadRequest("a request must not be retained", reason="retained")
        if shape.calls is None:
            assert isinstance(body, dict)  # `read` says only an object is an envelope
            return _enveloped(message, topics, route, body, reply)
        return _provided(message, topics, route, shape, reply, max_calls=max_calls)
    except ToolbusError as error:
        raw_id = body.get("id") if isinstance(body, dict) else None
        if isinstance(raw_id, str) and _id_problem(raw_id) is None:
            ident, generated = raw_id, False
        else:
            ident, generated = _new_id(), True
        # A 3.1.1 caller's trace goes on through its refusal, as it would through a call.
        fields = (
            {k: v for k in TRACE_HEADERS if isinstance(v := body.get(k), str)}
            if isinstance(body, dict)
            else {}
        )
        return Rejected(error, message.topic, message.payload, ident, reply, generated, fields)


def _enveloped(
    message: Inbound, topics: Topics, route: Route, body: dict[str, Any], reply: ReplyAddress | None
) -> Call | Calls:
    """Our own envelope: one call, answered in kind unless it asks for a provider's format."""
    # Escapes are the only way in, once the payload is UTF-8.
    if may_hold_surrogates(message.payload):
        _refuse_surrogates(body)
    request = envelope.request(body, list_tools=route.list_tools)
    call = _call(message, topics, route, request, reply)
    fmt = request.reply_format or ReplyFormat.TOOLBUS
    if fmt is ReplyFormat.TOOLBUS or route.list_tools:
        return call
    return _together(call, call.id, call.id_generated, fmt, (replace(call, reply=None),))


def _provided(
    message: Inbound,
    topics: Topics,
    route: Route,
    shape: Shape,
    reply: ReplyAddress | None,
    *,
    max_calls: int,
) -> Call | Calls:
    """A provider's message: each of its calls, with the options of its `toolbus` object."""
    assert shape.calls is not None
    if route.list_tools:
        raise BadRequest(
            "a tool listing takes our envelope, not tool calls", reason="not_a_listing"
        )
    if len(shape.calls) > max_calls:
        raise BadRequest(
            f"the message holds {len(shape.calls)} tool calls; at most {max_calls} are taken",
            reason="too_many_calls",
            limit=max_calls,
        )
    options = envelope.options(shape.options)
    if may_hold_surrogates(message.payload):
        walked = [[w.id, w.name, w.arguments] for w in shape.calls]
        _refuse_surrogates({"options": shape.options, "calls": walked})
    ids = [wanted.id for wanted in shape.calls if wanted.id is not None]
    if len(set(ids)) < len(ids):
        raise BadRequest("two tool calls share one id", reason="duplicate_call_id")
    if options.id is not None and (problem := _id_problem(options.id)) is not None:
        raise BadRequest("the request id cannot be echoed", reason=problem)
    # The reply's id: the message's own, the caller's `toolbus.id`, or a lone call's.
    usable = shape.id is not None and _id_problem(shape.id) is None
    given = (shape.id if usable else None) or options.id or (ids[0] if len(ids) == 1 else None)
    ident, generated = (given, False) if given else (_new_id(), True)
    first = _template(message, topics, route, options, reply)
    # Calls without ids (Ollama's) take the request's id and their place: repeats match.
    base = options.id
    calls = tuple(
        _one(first, route, wanted, f"{base}:{n}" if base and wanted.id is None else None)
        for n, wanted in enumerate(shape.calls)
    )
    fmt = options.reply_format or shape.format
    if fmt is ReplyFormat.TOOLBUS and len(calls) == 1:
        return replace(calls[0], reply=first.reply)  # one call in our format: a plain Reply
    return _together(first, ident, generated, fmt, calls)


def _together(
    template: Call, ident: str, generated: bool, fmt: ReplyFormat, calls: tuple[Call, ...]
) -> Calls:
    """The message's calls, with what they share (topic, reply address, trace). A task is
    one call answered in our format: a message of many, or in a provider's format, that
    asks for one is refused rather than answered as if it had not asked."""
    if template.task:
        raise BadRequest("a task is one call in the toolbus format", reason="task_needs_one_call")
    return Calls(
        id=ident,
        id_generated=generated,
        format=fmt,
        calls=calls,
        topic=template.topic,
        reply=template.reply,
        trace_fields=template.trace_fields,
        publish_trace=template.publish_trace,
    )


def _one(template: Call, route: Route, wanted: Wanted, derived: str | None) -> Call:
    """One call of a provider's message; a name we cannot echo is that call's problem."""
    if wanted.id is not None and (problem := _id_problem(wanted.id)) is not None:
        raise BadRequest("a tool call's id cannot be echoed", reason=problem)
    tool, trouble = _tool_of(route, wanted.name), wanted.problem
    if text_problem(tool) is not None:
        tool, trouble = "", BadRequest("the tool name cannot be echoed", reason="bad_character")
    ident = wanted.id or derived
    return replace(
        template,
        id=ident or _new_id(),
        id_generated=ident is None,
        provider_id=wanted.id is not None,
        tool=tool,
        arguments=wanted.arguments,
        reply=None,
        problem=trouble,
    )


def _tool_of(route: Route, named: str) -> str:
    """The call's tool: the body's name, which a `call/{tool}` topic must agree with
    (claim mode's `call/{a}/{b}` may be caller `a`'s tool `b`)."""
    if not route.tool:
        return named
    nested = route.ambiguous and route.tool.endswith(f"/{named}")
    if named and named != route.tool and not nested:
        raise BadRequest("the topic and the body name different tools")
    return route.tool


def _refuse_surrogates(body: dict[str, Any]) -> None:
    """Nothing could carry a lone surrogate further: not the reply, not an MCP server."""
    try:
        where = surrogate_path(body)
    except RecursionError:
        raise BadRequest("payload is nested too deeply") from None
    if where is not None:
        raise BadRequest("a string holds a lone UTF-16 surrogate", reason="surrogate", path=where)


def _parse(payload: bytes) -> object:
    try:
        # Strict UTF-8: `json.loads(bytes)` also takes UTF-16/32 and encoded surrogates.
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"payload is not UTF-8: {exc.reason} at byte {exc.start}") from None
    return strict_json(text, "payload")


def _call(
    message: Inbound, topics: Topics, route: Route, request: Request, reply: ReplyAddress | None
) -> Call:
    """The envelope's one call."""
    if request.id and (problem := _id_problem(request.id)) is not None:
        raise BadRequest("the request id cannot be echoed", reason=problem)
    if route.list_tools:
        tool = ""
    else:
        tool = _tool_of(route, request.tool or "")
        if not tool and request.continuation is None:  # a continuation's tool is its call's
            raise BadRequest("request names no tool: use `{prefix}/call/{tool}` or a `tool` field")
        if text_problem(tool) is not None:
            raise BadRequest("the tool name cannot be echoed", reason="bad_character")
    ident, generated = (request.id, False) if request.id else (_new_id(), True)
    # The request model is ours alone and dropped here: its arguments need no copy.
    return _template(
        message,
        topics,
        route,
        request,
        reply,
        ident=ident,
        id_generated=generated,
        tool=tool,
        arguments=request.arguments,
    )


def _template(
    message: Inbound,
    topics: Topics,
    route: Route,
    request: Options,
    reply: ReplyAddress | None,
    *,
    ident: str = "",
    id_generated: bool = False,
    tool: str = "",
    arguments: dict[str, Any] | None = None,
) -> Call:
    """What every call of a message shares: caller, deadline, reply address, trace; with
    the call's own id, tool and arguments for the envelope's one call (built once)."""
    deadline = deadline_at(message, request)
    if reply is not None and deadline is not None:
        reply = replace(reply, expires_at=deadline)
    return Call(
        id=ident,
        id_generated=id_generated,
        tool=tool,
        arguments={} if arguments is None else arguments,
        topic=message.topic,
        reply=reply,
        caller=_caller(topics, route, request),
        timeout_s=request.timeout_s,
        list_tools=route.list_tools,
        topic_path=route.ambiguous,
        payload_bytes=len(message.payload),
        publish_trace=bool(request.publish_trace)
        or any(
            k == PUBLISH_TRACE_PROPERTY and v.lower() in ("1", "true")
            for k, v in message.user_properties
        ),
        trace_fields={k: v for k in TRACE_HEADERS if (v := getattr(request, k))},
        user_properties=message.user_properties,
        deadline_at=deadline,
        tools_format=request.format or ToolsFormat.TOOLBUS,
        reply_topic=None if reply is None else reply.topic,
        correlation=None if reply is None else reply.correlation_data,
        message_id=request.id,  # (an envelope's call: its own id, not a provider's)
        redelivered=message.redelivered,
        delivery=message.delivery_id,
        progress=bool(request.progress) or _property_set(message, PROGRESS_PROPERTY),
        extend_on_progress=bool(request.extend_on_progress),
        task=bool(request.task) or _property_set(message, TASK_PROPERTY),
        wants_input=bool(request.input) or _property_set(message, INPUT_PROPERTY),
        continuation=request.continuation,
        input_responses=request.input_responses,
        approval=request.approval,
    )


def _property_set(message: Inbound, name: str) -> bool:
    """A v5 user property that switches an option on (`1` or `true`)."""
    return any(k == name and v.lower() in ("1", "true") for k, v in message.user_properties)


def _caller(topics: Topics, route: Route, request: Options) -> str | None:
    """Who is calling: the topic's word in `topic` mode, the request's claim otherwise."""
    claimed = request.caller or None
    if claimed is not None and text_problem(claimed) is not None:
        raise BadRequest("the caller name cannot be echoed", reason="bad_character")
    if topics.caller_identity == "topic":
        if claimed is not None and claimed != route.caller:
            raise Forbidden("the body names a caller the topic does not", reason="caller_mismatch")
        if route.caller == ANONYMOUS_CALLER:  # a login of that name must not become it
            raise Forbidden("only the bare topics are anonymous", reason="reserved_caller")
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
    if not ident:
        return "empty"
    if len(ident) > MAX_ID_CHARS:
        return "too_long"
    return text_problem(ident)


def _new_id() -> str:
    """A random (version 4) UUID, for a request that brought no id. From `random`, not
    the OS: it must be unique, not secret (it is echoed to the caller and never used for
    deduplication), and `uuid.uuid4()` costs a system call and an object per call."""
    bits = (_random_bits(128) & ~_UUID_FIXED) | _UUID_V4
    h = f"{bits:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UUID_FIXED = (0xF000 << 64) | (0xC000 << 48)  # the version nibble and the variant bits
_UUID_V4 = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant
_random_bits = random.getrandbits
