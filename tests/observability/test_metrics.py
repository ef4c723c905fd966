"""Metrics: calls by tool and outcome, durations, rewrites, dead letters, servers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.mqtt import Caller, call_topic
from toolbus.observability.metrics import Metrics
from toolbus.observability.sdk import configure_metrics


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def value(found: dict[str, list[Any]], name: str, **attributes: str) -> float:
    return float(
        sum(
            p.value
            for p in found.get(name, [])
            if all(p.attributes.get(k) == v for k, v in attributes.items())
        )
    )


async def test_worker_metrics(broker: Broker) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    async with (
        running_worker(make_settings(broker), meter=meter) as worker,
        Caller(broker.url) as caller,
        Caller(broker.url, v5=False) as old,
    ):
        for arguments in ({"text": "a"}, {"Text": "b"}, {}):
            await caller.call_tool(worker.topics, "echo", arguments)
        await caller.call_tool(worker.topics, f"no_such_tool_{'x' * 5}")
        await caller.subscribe(worker.topics.dead)
        await old.publish(call_topic(worker.topics, "echo"), b"not json")
        letter = json.loads((await caller.next_message()).payload)
        assert letter["error"]["code"] == "bad_request"
    found = points(reader)
    assert value(found, "toolbus.calls", tool="echo", outcome="ok") == 1
    assert value(found, "toolbus.calls", tool="echo", outcome="invalid_arguments") == 2
    # Unknown names never become labels.
    assert value(found, "toolbus.calls", tool="(unknown)", outcome="unknown_tool") == 1
    assert not any("no_such_tool" in str(p.attributes) for p in found["toolbus.calls"])
    assert sum(p.count for p in found["toolbus.call.duration"]) == 4
    assert value(found, "toolbus.dead_letters", code="bad_request") == 1
    assert value(found, "toolbus.calls.in_flight") == 0


def test_server_availability_gauge() -> None:
    reader = InMemoryMetricReader()
    Metrics(
        MeterProvider(metric_readers=[reader]).get_meter("test"),
        server_states=lambda: {"devices": "ready", "flaky": "degraded"},
    )
    found = points(reader)
    assert value(found, "toolbus.mcp.server.up", server="devices") == 1
    assert value(found, "toolbus.mcp.server.up", server="flaky") == 0


def test_rewrites_by_rule() -> None:
    from toolbus.wire.report import Change

    reader = InMemoryMetricReader()
    meters = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    meters.call_done(
        "t", "ok", 0.01, [Change("a", "b", "c", "static_map"), Change("d", "e", "f", "wrap_array")]
    )
    found = points(reader)
    assert value(found, "toolbus.normalize.rewrites", rule="static_map") == 1
    assert value(found, "toolbus.normalize.rewrites", rule="wrap_array") == 1


@pytest.mark.parametrize(
    "environ", [{}, {"OTEL_METRICS_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}]
)
def test_no_metrics_exported_when_disabled(environ: dict[str, str]) -> None:
    assert configure_metrics(environ) is None


def test_unknown_metrics_exporter_is_refused() -> None:
    with pytest.raises(ValueError, match="OTEL_METRICS_EXPORTER"):
        configure_metrics({"OTEL_METRICS_EXPORTER": "fax"})
