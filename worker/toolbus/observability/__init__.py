"""Observability: what a worker tells its operators, through the OpenTelemetry SDK.

sdk          tracer and meter providers from the `OTEL_*` environment, set up once
propagation  W3C trace context in and out of MQTT messages
spans        the tracer and the span vocabulary (attributes, failures, reports)
export       a call's spans published back to its caller as OTLP/JSON
metrics      the instruments a worker counts with
logs         one line per event, JSON or text, joined to the current trace

May import: the wire (toolbus.wire) only.
"""
