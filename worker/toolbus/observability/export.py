"""Trace export: what of a span leaves the worker, to a caller and to the operator.

A caller that asks for its spans (`publish_trace`) gets them on `{reply_topic}/trace`
as an `ExportTraceServiceRequest` in OTLP/JSON (hex ids, integer enums), with failures
told by their codes and a resource that names the service alone. The operator's
exporter gets a library's span (the mcp SDK's) with its failure told by its codes too
(`LibraryFailuresWithoutText`).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.trace import Status


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


# What a caller sees of an exception a span recorded (the mcp SDK's own spans record
# every exception raised through them), and the operator's exporter of a library's: its
# type, never its message or stack trace.
CALLERS_EXCEPTION_ATTRIBUTES = frozenset({"exception.type", "exception.escaped"})


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """Spans as OTLP/JSON (an `ExportTraceServiceRequest`): hex ids, integer enums; as a
    caller may see them (`_failures_without_text`), from a resource that names the
    service alone (`_service_only`)."""
    # Imported on the first call that asks for its spans: the OTLP encoder and protobuf
    # are a tenth of a second of every start otherwise.
    from google.protobuf.json_format import MessageToDict  # noqa: PLC0415 -- see above
    from opentelemetry.exporter.otlp.proto.common import trace_encoder  # noqa: PLC0415 -- see above

    document = MessageToDict(trace_encoder.encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        _service_only(resource_spans)
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
                _failures_without_text(span)
    return json.dumps(document, separators=(",", ":")).encode()


def _service_only(resource_spans: dict[str, Any]) -> None:
    """The resource as a caller sees it: `service.name`, nothing else. The operator's
    resource describes its own machines (`OTEL_RESOURCE_ATTRIBUTES`, the host and process
    detectors: host names and ids, command lines, install paths, the SDK's version), which
    are the operator's to export, not a caller's to read."""
    resource = resource_spans.get("resource", {})
    resource_spans["resource"] = {
        "attributes": [a for a in resource.get("attributes", []) if a.get("key") == "service.name"]
    }
    resource_spans.pop("schemaUrl", None)  # the resource's schema: of attributes now gone


def _failures_without_text(span: dict[str, Any]) -> None:
    """A failure as its codes alone: the status code and `error.type` stay, the status
    description goes (a library's span describes it with the error's text: the mcp SDK
    with a server's message, which may quote a value), and an exception event keeps its
    type (its message may quote anything, its stack shows the worker's install paths).
    The caller has the error's message in its reply."""
    status = span.get("status")
    if isinstance(status, dict):
        status.pop("message", None)
    for event in span.get("events", []):
        if event.get("name") == "exception":
            event["attributes"] = [
                a
                for a in event.get("attributes", [])
                if a.get("key") in CALLERS_EXCEPTION_ATTRIBUTES
            ]


def _hex_ids(node: dict[str, Any]) -> None:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants hex ids.
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in node:
            node[key] = base64.b64decode(node[key]).hex()


# The worker's own instrumentation scopes (`toolbus`, `toolbus.mcp`): their spans describe
# a failure in words that quote no value (`spans.mark_refused`).
OWN_SCOPE = "toolbus"


class LibraryFailuresWithoutText(SpanProcessor):
    """Hands finished spans to `inner` (the exporter's processor), a library's failure
    told by its codes alone: a span of another instrumentation scope (the mcp SDK's) with
    a status description or an exception event goes on as a copy without the description
    and with each exception's type only. The mcp SDK describes a server's error response
    with the server's text, which may quote an argument; the worker's own spans never
    carry an error's message, and neither does the operator's exporter."""

    def __init__(self, inner: SpanProcessor) -> None:
        self._inner = inner

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self._inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self._inner.on_end(_TextlessFailure(span) if _library_text(span) else span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _library_text(span: ReadableSpan) -> bool:
    """True for a span of another scope than the worker's whose failure has words."""
    scope = span.instrumentation_scope
    name = scope.name if scope is not None else ""
    if name == OWN_SCOPE or name.startswith(f"{OWN_SCOPE}."):
        return False
    return bool(span.status.description) or any(e.name == "exception" for e in span.events)


class _TextlessFailure(ReadableSpan):
    """A finished span as `_library_text` lets it go on: everything but the text."""

    def __init__(self, span: ReadableSpan) -> None:
        super().__init__(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=span.attributes,
            events=tuple(_event_without_text(e) for e in span.events),
            links=span.links,
            kind=span.kind,
            status=Status(span.status.status_code),
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )
        self._dropped = (span.dropped_attributes, span.dropped_events, span.dropped_links)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped[0]

    @property
    def dropped_events(self) -> int:
        return self._dropped[1]

    @property
    def dropped_links(self) -> int:
        return self._dropped[2]


def _event_without_text(event: Event) -> Event:
    if event.name != "exception":
        return event
    attributes = event.attributes or {}
    kept = {k: v for k, v in attributes.items() if k in CALLERS_EXCEPTION_ATTRIBUTES}
    return Event(event.name, kept, event.timestamp)


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


# The collector every tracer provider of this process shares (the provider is global).
COLLECTOR = TraceCollector()
