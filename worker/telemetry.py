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

import base64
import importlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from toolbus.report import Change

log = logging.getLogger("toolbus.telemetry")

TRACER_NAME = "toolbus"
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_HEADER_CHARS = 512


def default_tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def exporter_choice(env: Mapping[str, str], signal: str) -> str | None:
    """`otlp`, `console` or `none` for one signal (`TRACES`, `METRICS`); None when the SDK
    is disabled. Unset means `otlp` if an OTLP endpoint is configured, else `none`."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    choice = env.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
    if choice:
        return choice
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    return "otlp" if any(name in env for name in endpoints) else "none"


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OTEL_* settings a stdio MCP server should inherit (it names its own service)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith("OTEL_") and k != "OTEL_SERVICE_NAME"}


def configure_tracing(
    environ: Mapping[str, str] | None = None,
    *,
    record_for_callers: bool = False,
    service_name: str = "toolbus",
) -> TracerProvider | None:
    """Install the global tracer provider the environment asks for; None when disabled.

    `record_for_callers` records spans even with no exporter, so that calls asking for
    their spans back (`publish_trace`) get them.
    """
    env = os.environ if environ is None else environ
    choice = exporter_choice(env, "TRACES")
    if choice is None or (choice == "none" and not record_for_callers):
        return None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
    provider.add_span_processor(COLLECTOR)
    if choice != "none":
        provider.add_span_processor(BatchSpanProcessor(_exporter(choice, env)))
    trace.set_tracer_provider(provider)
    log.info("tracing: spans exported with %s", choice)
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


class TraceCollector(SpanProcessor):
    """Keeps the finished spans of the traces someone asked to see, until they are taken.

    Added to the tracer provider next to the exporter; only watched traces are kept,
    each until the call that watched it takes them (or at most `MAX_SPANS_PER_TRACE`).
    """

    MAX_SPANS_PER_TRACE = 512

    def __init__(self) -> None:
        self._watched: dict[int, list[ReadableSpan]] = {}

    def watch(self, trace_id: int) -> None:
        self._watched.setdefault(trace_id, [])

    def take(self, trace_id: int) -> list[ReadableSpan]:
        return self._watched.pop(trace_id, [])

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None:
            return
        kept = self._watched.get(span.context.trace_id)
        if kept is not None and len(kept) < self.MAX_SPANS_PER_TRACE:
            kept.append(span)

    def shutdown(self) -> None:
        self._watched.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """Spans as OTLP/JSON (an `ExportTraceServiceRequest`): hex ids, integer enums."""
    document = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return json.dumps(document, separators=(",", ":")).encode()


def _hex_ids(node: dict[str, Any]) -> None:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants hex ids.
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in node:
            node[key] = base64.b64decode(node[key]).hex()


def descendants(spans: list[ReadableSpan], root_span_id: int) -> list[ReadableSpan]:
    """The root span and every span below it (a trace may hold other calls too)."""
    children: dict[int, list[ReadableSpan]] = {}
    by_id: dict[int, ReadableSpan] = {}
    for span in spans:
        if span.context is None:
            continue
        by_id[span.context.span_id] = span
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)
    found = [by_id[root_span_id]] if root_span_id in by_id else []
    queue = [root_span_id]
    while queue:
        for child in children.get(queue.pop(), []):
            assert child.context is not None
            found.append(child)
            queue.append(child.context.span_id)
    return found


COLLECTOR = TraceCollector()
