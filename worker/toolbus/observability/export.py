"""Trace export over MQTT: a call's finished spans, kept until taken, as OTLP/JSON.

A caller that asks for its spans (`publish_trace`) gets them on `{reply_topic}/trace`
as an `ExportTraceServiceRequest` in OTLP/JSON (hex ids, integer enums).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor


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
# every exception raised through them): its type, never its message or stack trace.
CALLERS_EXCEPTION_ATTRIBUTES = frozenset({"exception.type", "exception.escaped"})


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """Spans as OTLP/JSON (an `ExportTraceServiceRequest`): hex ids, integer enums; as a
    caller may see them (`_failures_without_text`)."""
    document = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
                _failures_without_text(span)
    return json.dumps(document, separators=(",", ":")).encode()


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
