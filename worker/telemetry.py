"""Telemetry: the tracer and the span records of a call.

The OpenTelemetry API is a no-op until an SDK is configured, so recording costs next
to nothing by default. Exporter set-up arrives with the telemetry issue.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace

from worker.report import Change

TRACER_NAME = "toolbus"


def default_tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


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
