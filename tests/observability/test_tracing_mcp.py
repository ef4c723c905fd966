"""The MCP leg of a trace: caller -> worker -> `tools/call` -> the MCP server, one trace.

The worker runs in-process (its spans in the session's in-memory exporter); the MCP
servers are real processes: the demo server records its own spans and exports them with
the `OTEL_*` settings the worker hands it, to a stand-in collector (`tests/support/otlp.py`); a
test server reports the `_meta` and the context each call reached it with. Every link is
checked by trace id and parent span id, on the settled fast path and the full path.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.trace import SpanKind

from tests.support.harness import DEMO_SERVER, SPAN_ENDS, Broker, make_settings, running_worker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.processes import Serve, serve_env
from toolbus.observability.sdk import child_environment
from toolbus.wire.topics import Topics
from toolbus.worker.service import Worker

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
BAGGAGE = "tenant=kitchen,session=a%2Fb"  # W3C baggage: values percent-encoded
BAGGAGE_ENTRIES = {"tenant": "kitchen", "session": "a/b"}
CONTEXT_SERVER = {
    "command": sys.executable,
    "args": [str(Path(__file__).parents[1] / "support" / "servers" / "context_server.py")],
}
OTLP_SERVER = 2  # OTLP's SpanKind numbers, as the receiver keeps them


@pytest_asyncio.fixture(scope="module")
async def chain_worker(
    broker: Broker, spans: Any, collector: OtlpReceiver
) -> AsyncIterator[Worker]:
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER, "context": CONTEXT_SERVER})
    # What `toolbus serve` hands its stdio servers (sdk.child_environment), pointed at
    # the stand-in collector; exported at once, not in 5 s batches.
    child_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    async with running_worker(settings, child_env=child_env) as worker:
        yield worker


def trace_headers(trace_id: str) -> tuple[tuple[str, str], ...]:
    return (
        ("traceparent", TRACEPARENT.replace(CALLER_TRACE, trace_id)),
        ("tracestate", TRACESTATE),
        ("baggage", BAGGAGE),
    )


async def worker_spans(spans: Any, trace_id: str) -> dict[str, Any]:
    """The worker's spans of one trace by name, once its `process` span has ended."""

    def found() -> list[Any]:
        return [
            s for s in spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id
        ]

    await SPAN_ENDS.until(lambda: any(s.name.startswith("process ") for s in found()))
    return {s.name: s for s in found()}


async def call_traced(
    broker: Broker, worker: Worker, tool: str, arguments: dict[str, Any], trace_id: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A v5 call carrying the caller's trace context and baggage: the reply and its
    user properties."""
    reply_topic = reply_topic_for(worker.topics)
    async with Caller(broker.url) as caller:
        await caller.subscribe(reply_topic)
        await caller.publish(
            call_topic(worker.topics, tool),
            json.dumps({"arguments": arguments}),
            response_topic=reply_topic,
            correlation=trace_id.encode(),
            user_properties=trace_headers(trace_id),
        )
        message = await caller.next_message()
    return json.loads(message.payload), dict(getattr(message.properties, "UserProperty", []))


def hex_id(span_id: int) -> str:
    return format(span_id, "016x")


@pytest.mark.parametrize(
    ("path", "arguments", "rules"),
    [
        # In the schema's shape: the settled walk, no normalizing at all.
        ("settled", {"deviceName": "Switch One", "action": "on"}, set()),
        # A value to shape (text to integer): only the full path does that.
        (
            "full",
            {"device_name": "Living Room Lamp", "command": "dim", "brightness": "40"},
            {"static_map", "string_to_integer"},
        ),
    ],
)
async def test_one_trace_from_the_caller_through_the_mcp_client_to_the_server(
    broker: Broker,
    chain_worker: Worker,
    spans: Any,
    collector: OtlpReceiver,
    path: str,
    arguments: dict[str, Any],
    rules: set[str],
) -> None:
    trace_id = {"settled": "1" * 32, "full": "2" * 32}[path]
    reply, _ = await call_traced(broker, chain_worker, "control_zwave_device", arguments, trace_id)
    assert reply["ok"], reply
    assert reply["trace_id"] == trace_id
    assert {entry["rule"] for entry in reply["normalized"]} == rules  # the path taken

    found = await worker_spans(spans, trace_id)
    process = found[f"process {chain_worker.topics.call}/control_zwave_device"]
    assert hex_id(process.parent.span_id) == CALLER_SPAN
    execute = found["execute_tool control_zwave_device"]
    assert execute.parent.span_id == process.context.span_id
    client = found["tools/call control_zwave_device"]  # ours: the MCP client span
    assert client.kind is SpanKind.CLIENT
    assert client.parent.span_id == execute.context.span_id
    assert client.attributes["mcp.method.name"] == "tools/call"
    assert client.attributes["gen_ai.operation.name"] == "execute_tool"
    assert client.attributes["gen_ai.tool.name"] == "control_zwave_device"
    assert client.attributes["toolbus.mcp.server"] == "devices"
    assert client.context.trace_state.to_header() == TRACESTATE  # the caller's, kept
    sdk = found["MCP send tools/call control_zwave_device"]  # the SDK's: it writes _meta
    assert sdk.parent.span_id == client.context.span_id

    def servers(received: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [
            s
            for s in received
            if s.trace_id == trace_id and s.name == "tools/call control_zwave_device"
        ]

    [server] = servers(await collector.wait_for(lambda r: bool(servers(r)), timeout_s=30))
    assert server.resource["service.name"] == "toolbus-demo-devices"
    assert server.kind == OTLP_SERVER
    assert server.parent_span_id == hex_id(sdk.context.span_id)


async def test_trace_state_and_baggage_reach_the_servers_meta(
    broker: Broker, chain_worker: Worker, spans: Any
) -> None:
    trace_id = "3" * 32
    reply, _ = await call_traced(broker, chain_worker, "trace_context", {}, trace_id)
    assert reply["ok"], reply
    seen = reply["result"]["structured"]
    found = await worker_spans(spans, trace_id)
    sdk = found["MCP send tools/call trace_context"]
    assert sdk.parent.span_id == found["tools/call trace_context"].context.span_id
    assert seen["meta"]["traceparent"] == f"00-{trace_id}-{hex_id(sdk.context.span_id)}-01"
    assert seen["meta"]["tracestate"] == TRACESTATE
    assert (seen["trace_id"], seen["parent_span_id"]) == (trace_id, hex_id(sdk.context.span_id))
    assert _baggage(seen["meta"]["baggage"]) == BAGGAGE_ENTRIES


async def test_the_reply_carries_trace_state_and_baggage_back(
    broker: Broker, chain_worker: Worker, spans: Any
) -> None:
    trace_id = "4" * 32
    reply, properties = await call_traced(broker, chain_worker, "echo", {"text": "x"}, trace_id)
    assert reply["ok"]
    found = await worker_spans(spans, trace_id)
    [producer] = [span for name, span in found.items() if name.startswith("send ")]
    assert properties["traceparent"] == f"00-{trace_id}-{hex_id(producer.context.span_id)}-01"
    assert properties["tracestate"] == TRACESTATE
    assert _baggage(properties["baggage"]) == BAGGAGE_ENTRIES
    assert "baggage" not in reply  # a v5 caller reads it from the properties


async def test_a_311_caller_sends_and_gets_trace_state_and_baggage_in_the_body(
    broker: Broker, chain_worker: Worker, spans: Any
) -> None:
    trace_id = "5" * 32
    async with Caller(broker.url, v5=False) as caller:
        traceparent, tracestate, carried = (value for _, value in trace_headers(trace_id))
        reply = await caller.call_tool(
            chain_worker.topics,
            "trace_context",
            {},
            traceparent=traceparent,
            tracestate=tracestate,
            baggage=carried,
        )
    assert reply["ok"], reply
    assert reply["traceparent"].split("-")[1] == trace_id
    assert reply["tracestate"] == TRACESTATE
    assert _baggage(reply["baggage"]) == BAGGAGE_ENTRIES
    seen = reply["result"]["structured"]
    assert seen["meta"]["tracestate"] == TRACESTATE
    assert _baggage(seen["meta"]["baggage"]) == BAGGAGE_ENTRIES


def _baggage(header: str) -> dict[str, str]:
    from urllib.parse import unquote

    pairs = (entry.split(";")[0].split("=", 1) for entry in header.split(","))
    return {unquote(key.strip()): unquote(value.strip()) for key, value in pairs}


async def test_w3c_carriers_whatever_the_global_propagator_is(
    broker: Broker, chain_worker: Worker, spans: Any
) -> None:
    """`OTEL_PROPAGATORS` (here: none at all) sets what the process's HTTP neighbours
    speak; MQTT and `_meta` carry W3C's headers regardless."""
    from opentelemetry import propagate
    from opentelemetry.propagators.composite import CompositePropagator

    trace_id = "6" * 32
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))
    try:
        reply, properties = await call_traced(broker, chain_worker, "trace_context", {}, trace_id)
    finally:
        propagate.set_global_textmap(configured)
    assert reply["ok"] and reply["trace_id"] == trace_id
    found = await worker_spans(spans, trace_id)
    # The SDK injected nothing: the server continues from our client span.
    client = found["tools/call trace_context"]
    seen = reply["result"]["structured"]
    assert seen["meta"]["traceparent"] == f"00-{trace_id}-{hex_id(client.context.span_id)}-01"
    assert seen["parent_span_id"] == hex_id(client.context.span_id)
    assert _baggage(seen["meta"]["baggage"]) == BAGGAGE_ENTRIES
    assert properties["traceparent"].split("-")[1] == trace_id


async def test_the_client_span_is_made_with_the_workers_tracer(broker: Broker) -> None:
    """A worker given its own tracer (an application's provider, not the process-wide
    one) records the MCP client span there, under its `execute_tool` span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER})
    trace_id = "7" * 32
    async with running_worker(settings, tracer=provider.get_tracer("app")) as worker:
        reply, _ = await call_traced(
            broker, worker, "get_device_sensor_data", {"deviceName": "Hallway Sensor"}, trace_id
        )
    assert reply["ok"] and reply["trace_id"] == trace_id
    found = {s.name: s for s in exporter.get_finished_spans()}  # the worker has drained
    execute = found["execute_tool get_device_sensor_data"]
    client = found["tools/call get_device_sensor_data"]
    assert client.kind is SpanKind.CLIENT
    assert client.parent is not None and client.parent.span_id == execute.context.span_id
    assert format(client.context.trace_id, "032x") == trace_id


async def test_a_worker_that_records_nothing_passes_the_callers_context_on(
    broker: Broker, tmp_path: Path
) -> None:
    """No exporter, no SDK: no span is made, yet the caller's trace context and baggage
    reach the server's `_meta`, the server's span a child of the caller's."""
    prefix = f"bare{uuid.uuid4().hex[:8]}"
    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"context": CONTEXT_SERVER}}))
    env = serve_env(topic_prefix=prefix)  # no OTEL_*: nothing recorded
    flags = ("--broker", broker.url, "--mcp-config", str(servers))
    async with Serve(env, *flags) as serve, Caller(broker.url) as caller:
        await caller.subscribe(f"{prefix}/status/workers/+")
        async with asyncio.timeout(30):
            while True:
                status = json.loads((await caller.next_message()).payload)
                if status["servers"].get("context", {}).get("state") == "ready":
                    break
        reply = await caller.call_tool(
            Topics(prefix, "toolbus", (f"{prefix}/reply/",)),
            "trace_context",
            {},
            traceparent=TRACEPARENT,
            baggage=BAGGAGE,
        )
        assert await serve.exit_code(stop=True) == 0
    assert reply["ok"] and reply["trace_id"] == CALLER_TRACE
    seen = reply["result"]["structured"]
    assert seen["meta"]["traceparent"] == TRACEPARENT
    assert (seen["trace_id"], seen["parent_span_id"]) == (CALLER_TRACE, CALLER_SPAN)
    assert _baggage(seen["meta"]["baggage"]) == BAGGAGE_ENTRIES


def test_a_console_exporter_is_not_handed_to_stdio_servers() -> None:
    """A stdio server's stdout is its protocol: `console` (alone or in a list) becomes
    `none` for it, every other choice passes as it was."""
    handed = child_environment(
        {
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "console,otlp",
            "OTEL_LOGS_EXPORTER": "otlp",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
    )
    assert handed == {
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
