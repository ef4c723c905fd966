"""Propagation: W3C trace context in and out of MQTT messages.

Follows "W3C Trace Context: MQTT": `traceparent`/`tracestate` in MQTT v5 user
properties, or top-level JSON fields for MQTT 3.1.1 callers. Bad or missing headers
start a new trace; they never fail a call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract

TRACE_HEADERS = ("traceparent", "tracestate")
MAX_HEADER_CHARS = 512


def extract_context(
    user_properties: Iterable[tuple[str, str]], body_fields: Mapping[str, Any] | None
) -> Context | None:
    """The caller's trace context, from v5 user properties or body fields; None if absent or bad."""
    carrier: dict[str, str] = {}
    for key, value in user_properties:
        if key.lower() in TRACE_HEADERS and len(value) <= MAX_HEADER_CHARS:
            carrier[key.lower()] = value
    if not carrier and body_fields:
        for key in TRACE_HEADERS:
            field_value = body_fields.get(key)
            if isinstance(field_value, str) and len(field_value) <= MAX_HEADER_CHARS:
                carrier[key] = field_value
    if not carrier:
        return None
    try:
        context = extract(carrier)
    except (ValueError, TypeError):
        return None
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject_headers() -> tuple[tuple[str, str], ...]:
    """The current trace context as MQTT v5 user properties (empty without a span).

    Written here, as W3C's `TraceContextTextMapPropagator.inject` writes them, not through
    the global propagator: the carrier is always W3C's, and every reply sends one (the
    composite propagator, its baggage half and a dict carrier cost more than the line)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    if context.trace_state:
        return (("traceparent", traceparent), ("tracestate", context.trace_state.to_header()))
    return (("traceparent", traceparent),)
