"""Tracing: the caller's trace continues through MQTT, the worker and the MCP client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.harness import DEMO_SERVER, SPAN_ENDS, Broker, make_settings, running_worker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from toolbus.observability.propagation import extract_context
from toolbus.observability.sdk import configure_tracing
from toolbus.observability.spans import trace_id_of
from toolbus.worker.service import Worker

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def test_extract_from_user_properties_or_body() -> None:
    from opentelemetry import trace

    for carrier in ([("traceparent", TRACEPARENT)], []):
        context = extract_context(carrier, {"traceparent": TRACEPARENT})
        assert context is not None
        assert trace_id_of(trace.get_current_span(context)) == CALLER_TRACE


@pytest.mark.parametrize(
    "bad", ["", "00-zz-yy-01", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "x" * 600]
)
def test_bad_trace_headers_are_ignored(bad: str) -> None:
    assert extract_context([("traceparent", bad)], None) is None
    assert extract_context([], {"traceparent": bad}) is None


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
    ],
)
def test_nothing_is_exported_when_disabled(environ: dict[str, str]) -> None:
    assert configure_tracing(environ) is None


def test_unknown_exporter_is_refused() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        configure_tracing({"OTEL_TRACES_EXPORTER": "carrier-pigeon"})


@pytest_asyncio.fixture(scope="module")
async def traced_worker(broker: Broker, spans: Any) -> AsyncIterator[Worker]:
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER}, trace_steps=True)
    async with running_worker(settings) as worker:
        yield worker


async def by_trace(spans: Any, trace_id: str) -> list[Any]:
    """The trace's spans, once its `process` span (the last to end: it ends just after
    the reply has left) has finished."""

    def found() -> list[Any]:
        return [
            s for s in spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id
        ]

    await SPAN_ENDS.until(lambda: any(s.name.startswith("process ") for s in found()))
    return found()


async def test_a_v5_callers_trace_continues_through_the_mcp_call(
    broker: Broker, traced_worker: Worker, spans: Any
) -> None:
    worker = traced_worker
    reply_topic = reply_topic_for(worker.topics)
    async with Caller(broker.url) as caller:
        await caller.subscribe(reply_topic)
        topic = call_topic(worker.topics, "control_zwave_device")
        body = {"id": "traced-1", "arguments": {"device_name": "Switch Two", "command": "off"}}
        await caller.publish(
            topic,
            json.dumps(body),
            response_topic=reply_topic,
            correlation=b"c1",
            user_properties=(("traceparent", TRACEPARENT),),
        )
        message = await caller.next_message()
    reply = json.loads(message.payload)
    assert reply["ok"] and reply["trace_id"] == CALLER_TRACE
    user = dict(getattr(message.properties, "UserProperty", []))
    assert user["traceparent"].split("-")[1] == CALLER_TRACE
    assert "traceparent" not in reply  # v5 callers read it from the properties

    found = {s.name: s for s in await by_trace(spans, CALLER_TRACE)}
    consumer = found[f"process {topic}"]
    assert consumer.kind is SpanKind.CONSUMER
    assert format(consumer.parent.span_id, "016x") == CALLER_SPAN
    assert consumer.attributes["messaging.system"] == "mqtt"
    assert consumer.attributes["messaging.operation.type"] == "process"
    assert consumer.attributes["messaging.message.conversation_id"] == "traced-1"
    assert consumer.attributes["messaging.destination.name"] == topic
    execute = found["execute_tool control_zwave_device"]
    assert execute.parent.span_id == consumer.context.span_id
    assert execute.attributes["gen_ai.tool.name"] == "control_zwave_device"
    assert execute.attributes["gen_ai.tool.call.id"] == "traced-1"
    assert execute.attributes["toolbus.normalized.count"] == 2
    assert found["normalize"].parent.span_id == execute.context.span_id
    assert found["validate"].parent.span_id == execute.context.span_id
    client = found["tools/call control_zwave_device"]
    assert client.kind is SpanKind.CLIENT and client.parent.span_id == execute.context.span_id
    assert client.attributes["mcp.method.name"] == "tools/call"
    assert client.attributes["toolbus.mcp.server"] == "devices"
    sdk = found["MCP send tools/call control_zwave_device"]  # the SDK's own: it injects _meta
    assert sdk.parent.span_id == client.context.span_id
    assert "gen_ai.tool.call.arguments" not in execute.attributes  # values stay out by default
    producer = found[f"send {reply_topic}"]
    assert (
        producer.kind is SpanKind.PRODUCER and producer.parent.span_id == consumer.context.span_id
    )
    assert user["traceparent"].split("-")[2] == format(producer.context.span_id, "016x")


async def test_a_311_caller_sends_and_gets_the_context_in_the_body(
    broker: Broker, traced_worker: Worker, spans: Any
) -> None:
    async with Caller(broker.url, v5=False) as caller:
        reply = await caller.call_tool(
            traced_worker.topics,
            "echo",
            {"text": "x"},
            traceparent=TRACEPARENT.replace(CALLER_TRACE, "a" * 32),
        )
    assert reply["ok"] and reply["trace_id"] == "a" * 32
    assert reply["traceparent"].split("-")[1] == "a" * 32
    assert {s.name for s in await by_trace(spans, "a" * 32)} >= {
        "execute_tool echo",
        "normalize",
        "validate",
    }


async def test_bad_headers_start_a_new_trace_and_errors_mark_the_spans(
    broker: Broker, traced_worker: Worker, spans: Any
) -> None:
    async with Caller(broker.url) as caller:
        reply = await caller.call_tool(
            traced_worker.topics, "no_such_tool", traceparent="00-not-a-trace-01"
        )
    assert reply["error"]["code"] == "unknown_tool"
    assert reply["trace_id"] and reply["trace_id"] != CALLER_TRACE
    found = {s.name: s for s in await by_trace(spans, reply["trace_id"])}
    consumer = found[f"process {traced_worker.topics.call}/no_such_tool"]
    assert consumer.parent is None
    assert consumer.status.status_code is StatusCode.ERROR
    assert consumer.attributes["error.type"] == "unknown_tool"
    execute = found["execute_tool no_such_tool"]
    assert execute.attributes["error.type"] == "unknown_tool"
    assert [e.name for e in execute.events] == []  # an answered error is no crash: no stack


async def test_spans_published_back_as_otlp_json(
    broker: Broker, traced_worker: Worker, spans: Any
) -> None:
    reply_topic = reply_topic_for(traced_worker.topics)
    async with Caller(broker.url) as caller:
        await caller.subscribe(f"{reply_topic}/trace")
        reply, message = await caller.call(
            call_topic(traced_worker.topics, "get_device_sensor_data"),
            {"id": "pb-1", "arguments": {"device_name": "Hallway Sensor"}, "publish_trace": True},
            reply_topic=reply_topic,
        )
        published = await caller.next_message()
    assert reply["ok"]
    assert published.topic.value == f"{reply_topic}/trace"
    assert getattr(published.properties, "CorrelationData", None) == getattr(
        message.properties, "CorrelationData", None
    )
    assert dict(getattr(published.properties, "UserProperty", []))["toolbus-id"] == "pb-1"
    document = json.loads(published.payload)
    sent = [s for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    names = {s["name"] for s in sent}
    assert {
        f"process {traced_worker.topics.call}/get_device_sensor_data",
        "execute_tool get_device_sensor_data",
        f"send {reply_topic}",
        "normalize",
        "validate",
    } <= names
    assert any(n.endswith("tools/call get_device_sensor_data") for n in names)
    assert {s["traceId"] for s in sent} == {reply["trace_id"]}  # hex, as OTLP/JSON wants
    assert all(len(s["spanId"]) == 16 and isinstance(s["kind"], int) for s in sent)
    # The standard decoder reads it back (after turning hex ids into the proto's bytes).
    import base64

    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    for span in sent:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    parsed = ParseDict(document, ExportTraceServiceRequest())
    assert len(parsed.resource_spans[0].scope_spans) >= 1


async def test_argument_values_are_recorded_only_when_switched_on() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from toolbus.backends.local import BUILTIN_TOOLS
    from toolbus.calls.call import Call
    from toolbus.config import Settings
    from toolbus.worker.wiring import build_executor, build_registry

    for switch in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        settings = Settings(trace_arguments=switch)
        executor = build_executor(
            settings, build_registry(BUILTIN_TOOLS, settings), tracer=provider.get_tracer("t")
        )
        await executor.execute(Call(id="a", tool="echo", arguments={"text": "secret"}, topic="t"))
        [span] = [s for s in exporter.get_finished_spans() if s.name == "execute_tool echo"]
        recorded = (span.attributes or {}).get("gen_ai.tool.call.arguments")
        assert (recorded == '{"text": "secret"}') if switch else (recorded is None)


@pytest.mark.parametrize(
    ("topic_tool", "body", "code"),
    [
        ("echo", b"not json", "bad_request"),
        ("echo", b'{"arguments": {"text": true}}', "invalid_arguments"),
        ("datetime", b'{"arguments": {"timezone": "Mars/Olympus"}}', "invalid_arguments"),
        ("nothing_here", b"{}", "unknown_tool"),
    ],
)
async def test_each_failure_marks_the_consumer_span(
    broker: Broker, traced_worker: Worker, spans: Any, topic_tool: str, body: bytes, code: str
) -> None:
    reply_topic = reply_topic_for(traced_worker.topics)
    async with Caller(broker.url) as caller:
        reply, _ = await caller.call(
            call_topic(traced_worker.topics, topic_tool), body, reply_topic=reply_topic
        )
    assert reply["error"]["code"] == code
    found = {s.name: s for s in await by_trace(spans, reply["trace_id"])}
    consumer = found[f"process {traced_worker.topics.call}/{topic_tool}"]
    assert consumer.status.status_code is StatusCode.ERROR
    assert consumer.attributes["error.type"] == code
    assert f"send {reply_topic}" in found  # the error reply is traced too


@pytest.mark.parametrize("state", ["", "vendor=a,other=b"])
@pytest.mark.parametrize("flags", ["00", "01", "03"])
def test_injected_headers_are_what_the_w3c_propagator_writes(state: str, flags: str) -> None:
    from opentelemetry import context as context_api
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from toolbus.observability.propagation import inject_headers

    w3c = TraceContextTextMapPropagator()
    incoming = {"traceparent": TRACEPARENT[:-2] + flags, "tracestate": state}
    token = context_api.attach(w3c.extract(incoming))
    try:
        expected: dict[str, str] = {}
        w3c.inject(expected)
        assert dict(inject_headers()) == expected
        assert trace.get_current_span().get_span_context().is_valid
    finally:
        context_api.detach(token)
    assert inject_headers() == ()


def test_baggage_comes_in_with_a_valid_traceparent_only() -> None:
    from opentelemetry import baggage

    from toolbus.observability.propagation import MAX_BAGGAGE_CHARS

    tenant = ("baggage", "tenant=kitchen")
    for properties, fields in (
        ([("traceparent", TRACEPARENT), tenant], None),
        ([], dict([("traceparent", TRACEPARENT), tenant])),
    ):
        context = extract_context(properties, fields)
        assert context is not None and baggage.get_all(context) == {"tenant": "kitchen"}
    assert extract_context([tenant], None) is None  # no trace to carry it
    assert extract_context([("traceparent", "garbage"), tenant], None) is None
    too_long = ("baggage", "k=" + "v" * MAX_BAGGAGE_CHARS)
    context = extract_context([("traceparent", TRACEPARENT), too_long], None)
    assert context is not None and dict(baggage.get_all(context)) == {}  # the trace stays


def test_injected_headers_carry_the_current_baggage() -> None:
    from opentelemetry import baggage
    from opentelemetry import context as context_api

    from toolbus.observability.propagation import inject_headers

    incoming = extract_context([("traceparent", TRACEPARENT), ("baggage", "a=1,b=x%20y")], None)
    assert incoming is not None
    token = context_api.attach(incoming)
    try:
        headers = dict(inject_headers())
        assert headers["traceparent"] == TRACEPARENT
        again = extract_context(list(headers.items()), None)
        assert again is not None and baggage.get_all(again) == {"a": "1", "b": "x y"}
    finally:
        context_api.detach(token)


def test_a_published_trace_keeps_an_exceptions_type_alone() -> None:
    """A span that recorded an exception (the mcp SDK's own spans record every one raised
    through them): the caller who asked for the trace sees its type, not its message
    (which may quote a value, in the event and the status) or its stack (the worker's
    install paths)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from toolbus.observability.export import otlp_json

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with (
        pytest.raises(ValueError, match="hunter2"),
        provider.get_tracer("mcp-python-sdk").start_as_current_span("tools/call x"),
    ):
        raise ValueError("'hunter2' is not valid")
    [recorded] = exporter.get_finished_spans()
    assert [e.name for e in recorded.events] == ["exception"]  # as the SDK records it
    text = otlp_json([recorded]).decode()
    assert "hunter2" not in text
    [span] = [
        s
        for rs in json.loads(text)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    [event] = span["events"]
    assert span["status"] == {"code": 2}  # ERROR; the SDK described it with the text
    assert {a["key"]: a["value"] for a in event["attributes"]} == {
        "exception.type": {"stringValue": "ValueError"},
        "exception.escaped": {"stringValue": "False"},
    }
