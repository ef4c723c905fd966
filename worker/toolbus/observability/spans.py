"""Spans: the tracer, and what toolbus records on a span, in one vocabulary.

Attributes follow the OpenTelemetry messaging and gen_ai/MCP semantic conventions;
a failure is always marked the same way (`mark_failed`), whatever stage saw it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import Token
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import context, trace
from opentelemetry.context import Context

from toolbus.wire.errors import ToolbusError
from toolbus.wire.report import Change

TRACER_NAME = "toolbus"
# On a message's `process` span: its reply is a stored one sent again (nothing ran).
DEDUP_REPLAYED = "toolbus.dedup.replayed"


def default_tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


_UNSET_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def records_nothing(tracer: trace.Tracer) -> bool:
    """True when no span of `tracer` can ever record: the API's no-op, which is what the
    process-wide tracer is until an SDK provider is installed. Asked per message (a
    global lookup), so a provider installed later is seen at once."""
    if type(tracer) is trace.ProxyTracer:  # `type`, not isinstance: an ABC check costs more
        return isinstance(trace.get_tracer_provider(), _UNSET_PROVIDERS)
    return isinstance(tracer, trace.NoOpTracer)


def child_span(
    tracer: trace.Tracer,
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    root: bool = True,
) -> AbstractContextManager[trace.Span]:
    """A span for one step, made only where it can be recorded: under a recording span,
    or as a root when `tracer` can record. Under a span that does not record (sampled
    out, or the API's no-op carrying a caller's context) it would not be sampled either,
    and costs as much as the step it describes: the current span stands in (what is set
    on it goes nowhere). `root=False`: never a root span (a caller that always runs under
    a span when it traces, and only then)."""
    current = trace.get_current_span()
    if current.is_recording() or (
        root and current is trace.INVALID_SPAN and not records_nothing(tracer)
    ):
        return current_span(tracer, name, attributes, kind=kind)
    return nullcontext(current)


def current_span(
    tracer: trace.Tracer,
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    context: Context | None = None,
) -> AbstractContextManager[trace.Span]:
    """`tracer.start_as_current_span`, one context manager fewer: the span started now
    and made current by `trace.use_span`, which ends it and records an exception that
    escapes (as `start_as_current_span` does, which wraps the same `use_span` in a
    generator of its own: ~2 µs of a span's ~30 on the loop)."""
    span = tracer.start_span(name, context=context, kind=kind, attributes=attributes)
    return trace.use_span(span, end_on_exit=True)


def open_child_span(
    tracer: trace.Tracer,
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    root: bool = True,
) -> tuple[trace.Span, bool]:
    """`child_span`'s span, started but not made current: for a step that pauses in
    between (a call prepared, claimed, then run), current again with `trace.use_span`
    while it works. True: the span is new, and its opener must end it; False: the current
    span stands in, as in `child_span`."""
    current = trace.get_current_span()
    if current.is_recording() or (
        root and current is trace.INVALID_SPAN and not records_nothing(tracer)
    ):
        return tracer.start_span(name, attributes=attributes), True
    return current, False


def make_current(span: trace.Span) -> Token[Context]:
    """Make `span` current (an opened `open_child_span`) until `restore(token)`: what
    `trace.use_span` does, without a context manager, so a caller that often has no span
    of its own pays nothing for it."""
    return context.attach(trace.set_span_in_context(span))


def restore(token: Token[Context] | None) -> None:
    """Undo `make_current` (None: nothing was made current)."""
    if token is not None:
        context.detach(token)


def messaging_attributes(
    operation: str, destination: str, conversation_id: str, client_id: str, **extra: Any
) -> dict[str, Any]:
    """Semantic-convention attributes of an MQTT process/send span."""
    return {
        "messaging.system": "mqtt",
        "messaging.destination.name": destination,
        "messaging.operation.type": operation,
        "messaging.message.conversation_id": conversation_id,
        "messaging.client.id": client_id,
        **extra,
    }


def url_without_secrets(url: str) -> str:
    """`url` without its userinfo, query and fragment, where tokens travel: for spans."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # not a URL we can take apart: nothing of it is kept
        return ""
    if ":" in host:  # IPv6, bracketed again
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def server_attributes(url: str) -> dict[str, Any]:
    """The `server.*` and `url.full` attributes of a client span to `url`, secrets dropped."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return {}
    attributes: dict[str, Any] = {"url.full": url_without_secrets(url)}
    if host:
        attributes["server.address"] = host
    if port is not None:
        attributes["server.port"] = port
    return attributes


def mark_failed(span: trace.Span, code: str, message: str | None = None) -> None:
    """ERROR status with the wire code as `error.type`; `message` (value-free: see
    `mark_refused`) as the status description, else the code."""
    span.set_status(trace.StatusCode.ERROR, message or code)
    span.set_attribute("error.type", code)


def mark_refused(span: trace.Span, error: ToolbusError, *, values: bool = False) -> None:
    """A call answered with `error`: its code, and a message that holds no value of the
    call unless `values` (`trace_arguments`): the error's own text may quote an argument
    (jsonschema's "'hunter2' is not of type 'integer'"), a tool's text anything. No
    exception event either: an answered error is an outcome, not a crash, and its stack
    (install paths, and the message again) would reach a caller who asks for the trace."""
    mark_failed(span, error.code.value, error.message if values else error.summary)


@contextmanager
def step_span(
    tracer: trace.Tracer,
    name: str,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[trace.Span]:
    """A span for one step that may raise: a refusal marked as `mark_refused` does,
    where the SDK would record the exception with its message and stack."""
    with tracer.start_as_current_span(
        name,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except ToolbusError as error:
            mark_refused(span, error)
            raise


def trace_id_of(span: trace.Span) -> str | None:
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def record_normalization(span: trace.Span, entries: Iterable[Change]) -> None:
    """One span event per report entry; values never appear, only keys, types and rules."""
    if not span.is_recording():
        return
    count = 0
    for entry in entries:
        count += 1
        span.add_event(
            "toolbus.normalize",
            {
                "toolbus.path": entry.path,
                "toolbus.from": entry.from_,
                "toolbus.to": entry.to,
                "toolbus.rule": entry.rule,
            },
        )
    span.set_attribute("toolbus.normalized.count", count)
