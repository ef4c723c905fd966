"""SDK set-up: tracer and meter providers from the standard `OTEL_*` variables, read once.

`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the resource,
`OTEL_TRACES_SAMPLER(_ARG)` sample, `OTEL_EXPORTER_OTLP_*` point the OTLP/HTTP exporters
at a collector. Exporter choice per signal (`OTEL_TRACES_EXPORTER`,
`OTEL_METRICS_EXPORTER`): `otlp`, `console` or `none`; when unset, `otlp` if an OTLP
endpoint is configured, nothing otherwise (no collector, no error spam). The API is a
no-op until this runs, so recording costs next to nothing by default.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from toolbus.observability.export import COLLECTOR, LibraryFailuresWithoutText
from toolbus.observability.sampling import OperatorSampling, operator_sampler

if TYPE_CHECKING:  # the metrics SDK is imported where a meter provider is made
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.metrics.view import View

log = logging.getLogger("toolbus.telemetry")

# The GIL switch interval of a worker that traces (the interpreter's default: 5 ms);
# measured in bench/README.md, "Tracing's cost".
TRACED_SWITCH_INTERVAL_S = 0.0005

# Tool calls take from about a millisecond (a local tool) to a minute (a slow device);
# the SDK's default bounds (0 ... 10000) are for milliseconds and would put every call,
# recorded in seconds, in the first bucket.
CALL_DURATION_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def metric_views() -> list[View]:
    """How the worker's instruments aggregate, for every reader (OTLP, Prometheus)."""
    from opentelemetry.sdk.metrics.view import (
        ExplicitBucketHistogramAggregation,
        View,
    )

    return [
        View(
            instrument_name="toolbus.call.duration",
            aggregation=ExplicitBucketHistogramAggregation(CALL_DURATION_BUCKETS_S),
        )
    ]


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


EXPORTER_CHOICES = frozenset(
    {"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"}
)


def _without_console(choice: str) -> str:
    """`console,otlp` -> `otlp`; `console` -> `none`."""
    kept = [c.strip() for c in choice.split(",") if c.strip().lower() != "console"]
    return ",".join(kept) or "none"


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OTEL_* settings a stdio MCP server should inherit (it names its own service).

    Never the exporter headers (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TRACES_HEADERS`, ...):
    they often carry a collector's bearer token. A server that needs them names them
    in its own `env`.

    A `console` exporter is not passed on: a stdio server's stdout is its protocol, and a
    server that prints its spans there (most SDKs' console exporters do) breaks its own
    session. It gets `none` for that signal instead.
    """
    env = os.environ if environ is None else environ
    return {
        k: _without_console(v) if k in EXPORTER_CHOICES else v
        for k, v in env.items()
        if k.startswith("OTEL_") and k != "OTEL_SERVICE_NAME" and not k.endswith("_HEADERS")
    }


class HashedOnce(Resource):
    """A resource whose hash is computed once. The OTLP encoder groups each exported span
    by its resource, and `Resource.__hash__` writes the attributes out as JSON every time:
    about a tenth of the exporter thread's time, holding the GIL the event loop needs.
    The resource never changes after start-up (its attributes are immutable)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def configure_tracing(
    environ: Mapping[str, str] | None = None,
    *,
    record_for_callers: bool = False,
    service_name: str = "toolbus",
) -> TracerProvider | None:
    """Install the global tracer provider the environment asks for; None when disabled.

    `record_for_callers` records spans even with no exporter, so that calls asking for
    their spans back (`publish_trace`) get them. The sampler is `OTEL_TRACES_SAMPLER`'s,
    read from `environ`, with a caller's sampled flag unable to turn it on
    (`sampling.OperatorSampling`); a library's span reaches the exporter with its failure
    told by codes alone (`export.LibraryFailuresWithoutText`).
    """
    env = os.environ if environ is None else environ
    choice = exporter_choice(env, "TRACES")
    if choice is None or (choice == "none" and not record_for_callers):
        return None
    resource = HashedOnce(
        Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
    )
    # The operator's sampler, which a caller's sampled flag cannot turn on (`sampling`).
    sampler = OperatorSampling(operator_sampler(env))
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(COLLECTOR)
    if choice != "none":
        exporting = BatchSpanProcessor(_span_exporter(choice, env))
        provider.add_span_processor(LibraryFailuresWithoutText(exporting))
    trace.set_tracer_provider(provider)
    log.info("tracing: spans exported with %s", choice)
    return provider


def settle_for_tracing() -> None:
    """The interpreter set for a worker that traces, once its start-up is done.

    Spans wait in the exporter's queue long enough to reach the collector's oldest
    generation, whose every pass then walked the whole start-up heap (modules, schemas:
    some 100 000 objects, tens of ms a pass, on the loop): frozen, the start-up heap is
    left out of those passes (it lives as long as the worker anyway). The exporter's
    thread encodes a batch holding the GIL; the loop, back from each socket call, waited
    up to the switch interval (5 ms) for it, several times a call: a tenth of that."""
    gc.freeze()
    sys.setswitchinterval(TRACED_SWITCH_INTERVAL_S)


def _span_exporter(choice: str, env: Mapping[str, str]) -> SpanExporter:
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
    # Imported here: loading the exporter (and protobuf) costs start-up time nobody else needs.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def configure_metrics(
    environ: Mapping[str, str] | None = None, *, prometheus: bool = False
) -> MeterProvider | None:
    """Install the global meter provider the environment asks for; with `prometheus`
    (an `http_port` is set) also a reader that the HTTP listener's /metrics renders."""
    env = os.environ if environ is None else environ
    choice = exporter_choice(env, "METRICS")
    if choice is None or (choice == "none" and not prometheus):
        return None
    # Imported here: a worker that exports no metrics (the default) starts without the
    # metrics SDK (a twentieth of a second).
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    readers: list[MetricReader] = []
    if choice == "otlp":
        # Imported here, as for traces: only a worker that exports pays for loading it.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    elif choice == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    elif choice != "none":
        raise ValueError(f"OTEL_METRICS_EXPORTER={choice!r}: use otlp, console or none")
    if prometheus and (reader := _prometheus()) is not None:
        readers.append(reader)
    if not readers:
        return None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "toolbus")})
    provider = MeterProvider(resource=resource, metric_readers=readers, views=metric_views())
    metrics.set_meter_provider(provider)
    return provider


def _prometheus() -> MetricReader | None:
    """A reader feeding prometheus_client's default registry (beside its process and
    platform collectors); None without the extra, and /metrics then says which to install."""
    try:
        exporter = importlib.import_module("opentelemetry.exporter.prometheus")
    except ImportError:
        log.warning(
            "/metrics needs the prometheus extra: install opentelemetry-exporter-prometheus "
            "and prometheus-client where toolbus is installed (docs/deployment.md; toolbus "
            "is not on PyPI); /healthz and /readyz are served without it"
        )
        return None
    reader: MetricReader = exporter.PrometheusMetricReader()
    return reader
