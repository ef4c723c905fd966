"""Propagation: W3C trace context and baggage in and out of MQTT messages and MCP calls.

Follows "W3C Trace Context: MQTT": `traceparent`/`tracestate` (and W3C `baggage`) in
MQTT v5 user properties, or top-level JSON fields of the same names for MQTT 3.1.1
callers. The same three headers go into an MCP request's `_meta` (SEP-414). Always
W3C's formats, read and written here with W3C's own propagators, never through the
global one: `OTEL_PROPAGATORS` (say `b3` for a Zipkin shop) chooses what the worker's
own HTTP neighbours speak, not what the MQTT and MCP carriers are. Bad or missing
headers start a new trace; they never fail a call. Baggage travels only with a valid
`traceparent`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context, attach, detach
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
MAX_HEADER_CHARS = 512
MAX_BAGGAGE_CHARS = 8192  # W3C Baggage's own limit for the whole header

_TRACE_CONTEXT = TraceContextTextMapPropagator()
_BAGGAGE = W3CBaggagePropagator()


def header_limit(name: str) -> int:
    """The longest value of trace header `name` read (longer: ignored, as if absent)."""
    return MAX_BAGGAGE_CHARS if name == "baggage" else MAX_HEADER_CHARS


def extract_context(
    user_properties: Iterable[tuple[str, str]], body_fields: Mapping[str, Any] | None
) -> Context | None:
    """The caller's trace context (with its baggage), from v5 user properties or body
    fields; None if absent or bad."""
    carrier: dict[str, str] = {}
    for key, value in user_properties:
        name = key.lower()
        if name in TRACE_HEADERS and len(value) <= header_limit(name):
            carrier[name] = value
    if not carrier and body_fields:
        for name in TRACE_HEADERS:
            field_value = body_fields.get(name)
            if isinstance(field_value, str) and len(field_value) <= header_limit(name):
                carrier[name] = field_value
    if "traceparent" not in carrier:
        return None
    try:
        context = _TRACE_CONTEXT.extract(carrier)
        if not trace.get_current_span(context).get_span_context().is_valid:
            return None
        return _BAGGAGE.extract(carrier, context) if "baggage" in carrier else context
    except (ValueError, TypeError):
        return None


def carrying_baggage(context: Context | None) -> AbstractContextManager[None]:
    """The caller's baggage made current for the message's handling, when it sent any.

    A span started with `context=` takes only its parent from it: the context made current
    is the span's on top of the current one, without the caller's baggage. Without
    baggage (nearly always) nothing is attached: no cost."""
    if context is None or not baggage.get_all(context):
        return nullcontext()
    return _attached(context)


@contextmanager
def _attached(context: Context) -> Iterator[None]:
    token = attach(context)
    try:
        yield
    finally:
        detach(token)


def inject_headers() -> tuple[tuple[str, str], ...]:
    """The current trace context and baggage as W3C headers (empty without a span): a
    reply's MQTT v5 user properties, a 3.1.1 reply's body fields, an MCP call's `_meta`.

    `traceparent` and `tracestate` are written here as W3C's `TraceContextTextMapPropagator`
    writes them (every traced reply sends them: the propagator and a dict carrier cost more
    than the line); baggage, rarely present, by W3C's baggage propagator."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    headers: tuple[tuple[str, str], ...] = (("traceparent", traceparent),)
    if context.trace_state:
        headers += (("tracestate", context.trace_state.to_header()),)
    if baggage.get_all():
        carrier: dict[str, str] = {}
        _BAGGAGE.inject(carrier)
        if "baggage" in carrier:
            headers += (("baggage", carrier["baggage"]),)
    return headers
