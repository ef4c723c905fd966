"""The normalization report (normalization/report.py) where it ends up: the log and the span."""

from __future__ import annotations

import logging

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.logwait import watching
from tests.support.normalize_cases import SEED_MAP, mcp_tool, registry_with, run
from toolbus.calls.call import Call
from toolbus.config import Settings
from toolbus.worker.wiring import build_executor


async def test_the_transformation_is_logged_without_values() -> None:
    with watching("toolbus.normalize", "normalized", logging.DEBUG) as logged:
        await run(
            Settings(argument_maps=SEED_MAP),
            mcp_tool(),
            {"device_name": "Switch One", "command": "on"},
        )
    assert [
        (r.levelno, r.getMessage(), r.__dict__["tool"], r.__dict__["changes"])
        for r in logged.records
    ] == [
        (
            logging.DEBUG,
            "normalized control_zwave_device: "
            "{device_name: ..., command: ...} -> {deviceName: ..., action: ...}",
            "control_zwave_device",
            "{device_name: ..., command: ...} -> {deviceName: ..., action: ...}",
        )
    ]


async def test_the_report_is_recorded_on_the_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = registry_with(mcp_tool())
    executor = build_executor(
        Settings(argument_maps=SEED_MAP), registry, tracer=provider.get_tracer("test")
    )
    await executor.execute(
        Call(
            id="s",
            tool="ControlZwaveDevice",
            arguments={"device_name": "a", "command": "on"},
            topic="t",
        )
    )
    await executor.execute(
        Call(id="f", tool="control_zwave_device", arguments={"deviceName": 1}, topic="t")
    )
    ok, failed = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert ok.name == "execute_tool control_zwave_device"
    events = [
        (e.attributes["toolbus.path"], e.attributes["toolbus.rule"])
        for e in ok.events
        if e.attributes
    ]
    assert events == [
        ("tool", "tool_spelling"),
        ("arguments.device_name", "static_map"),
        ("arguments.command", "static_map"),
    ]
    assert ok.attributes is not None and ok.attributes["toolbus.normalized.count"] == 3
    assert failed.attributes is not None and failed.attributes["error.type"] == "invalid_arguments"
    assert not any(v == "a" for e in ok.events for v in (e.attributes or {}).values())  # no values
