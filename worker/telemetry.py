"""Telemetry: tracing set-up, W3C context propagation over MQTT, span records of a call.

Set up from the standard `OTEL_*` variables: `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` name the resource, `OTEL_TRACES_SAMPLER(_ARG)` sample,
`OTEL_EXPORTER_OTLP_*` point the OTLP/HTTP exporter at a collector. Exporter choice,
`OTEL_TRACES_EXPORTER`: `otlp`, `console`, or `none`; when unset, spans go over OTLP
if an OTLP endpoint is configured, nowhere otherwise (no collector, no error spam).
The API is a no-op until this runs, so recording costs next to nothing by default.

Propagation follows "W3C Trace Context: MQTT": `traceparent`/`tracestate` in MQTT v5
user properties, or top-level JSON fields for MQTT 3.1.1 callers. Bad or missing
headers start a new trace; they never fail a call.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from worker.report import Change

log = logging.getLogger("toolbus.telemetry")

TRACER_NAME = "toolbus"
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_HEADER_CHARS = 512


def default_tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def configure_tracing(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install the global tracer provider the environment asks for; None when disabled."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    choice = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not choice:
        has_endpoint = (
            "OTEL_EXPORTER_OTLP_ENDPOINT" in env or "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in env
        )
        choice = "otlp" if has_endpoint else "none"
    if choice == "none":
        return None
    exporter = _exporter(choice, env)
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "toolbus")})
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing: exporting spans with %s", choice)
    return provider


def _exporter(choice: str, env: Mapping[str, str]) -> SpanExporter:
    if choice == "console":
        return ConsoleSpanExporter()
    if choice != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={choice!r}: use otlp, console or none")
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "grpc":
        try:
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError:
            raise ValueError(
                "OTLP over gRPC needs the extra: pip install 'toolbus[grpc]'"
            ) from None
        exporter: SpanExporter = grpc.OTLPSpanExporter()
        return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

    return OTLPSpanExporter()


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
    """The current trace context as MQTT v5 user properties (empty without a span)."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return tuple((k, v) for k, v in carrier.items() if k in TRACE_HEADERS)


def trace_id_of(span: trace.Span) -> str | None:
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def record_normalization(span: trace.Span, entries: Iterable[Change]) -> None:
    """One span event per report entry; values never appear, only keys, types and rules."""
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
