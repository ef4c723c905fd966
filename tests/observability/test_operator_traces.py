"""What a caller can see of the operator's tracing, and make it record (issue 29.6), from a
real `toolbus serve` on a real broker, exporting to a stand-in collector
(`tests/support/otlp.py`), with real MCP servers:

- a published trace (`publish_trace`) names the worker's service and nothing more of the
  operator's resource (hosts, processes, SDK, `OTEL_RESOURCE_ATTRIBUTES`);
- a caller's sampled flag cannot make the operator's exporter record what the operator's
  sampler drops: it gets a copy recorded for itself, when it asks, and nothing is exported;
- the mcp SDK's CLIENT span reaches the exporter without the server's error text.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.observability.test_published_traces import CONTEXT_SERVER, published_spans
from tests.support.harness import DEMO_SERVER, Broker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.processes import RUN_BOUND_S, Serve, serve_env
from toolbus.observability.sampling import OperatorSampling, operator_sampler
from toolbus.wire.topics import Topics

SECRET = "hunter2-S3CRET"
# The operator's resource: what a caller must not learn from its published trace.
OPERATOR_ENVIRONMENT = "ops-secret-env"
OPERATOR_RESOURCE = f"deployment.environment={OPERATOR_ENVIRONMENT},team=ops"
CALLER_SPAN = "b7ad6b7169203331"


def traceparent(trace_id: str, flags: str = "01") -> str:
    return f"00-{trace_id}-{CALLER_SPAN}-{flags}"


async def serving(
    broker: Broker, tmp_path: Path, **otel: str
) -> AsyncIterator[tuple[Serve, Topics]]:
    """`toolbus serve` with the demo device server and the context server, both ready."""
    prefix = f"ot{uuid.uuid4().hex[:8]}"
    servers = tmp_path / "mcp.json"
    servers.write_text(
        json.dumps({"mcpServers": {"devices": DEMO_SERVER, "context": CONTEXT_SERVER}})
    )
    env = {**serve_env(topic_prefix=prefix), **otel}
    topics = Topics(prefix, "toolbus", (f"{prefix}/reply/",))
    async with (
        Serve(env, "--broker", broker.url, "--mcp-config", str(servers)) as serve,
        Caller(broker.url) as watcher,
    ):
        await watcher.subscribe(f"{prefix}/status/workers/+")
        async with asyncio.timeout(RUN_BOUND_S):
            while True:
                status = json.loads((await watcher.next_message(RUN_BOUND_S)).payload)
                states = {name: s.get("state") for name, s in status["servers"].items()}
                if states == {"devices": "ready", "context": "ready"}:
                    break
        yield serve, topics


def exporting_env(collector: OtlpReceiver, **more: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # exported at once, not in 5 s batches
        **more,
    }


@pytest_asyncio.fixture(scope="module")
async def exporting(
    broker: Broker, collector: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Serve, Topics]]:
    """The operator's resource is rich: its own attributes and the process and host
    detectors (command line, executable path, pid, host id)."""
    otel = exporting_env(
        collector,
        OTEL_RESOURCE_ATTRIBUTES=OPERATOR_RESOURCE,
        OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="otel,process,host",
    )
    async for served in serving(broker, tmp_path_factory.mktemp("exporting"), **otel):
        yield served


async def call(
    broker: Broker,
    topics: Topics,
    tool: str,
    arguments: dict[str, Any],
    *,
    publish_trace: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> tuple[dict[str, Any], dict[str, str], bytes | None]:
    """A v5 call: its reply, the reply's user properties, and the trace published after
    it when asked (None when the reply says none follows)."""
    reply_topic = reply_topic_for(topics)
    body: dict[str, Any] = {"arguments": arguments}
    if publish_trace:
        body["publish_trace"] = True
    async with Caller(broker.url) as caller:
        await caller.subscribe(reply_topic)
        await caller.subscribe(f"{reply_topic}/trace")
        await caller.publish(
            call_topic(topics, tool),
            json.dumps(body),
            response_topic=reply_topic,
            correlation=b"c",
            user_properties=headers,
        )
        message = await caller.next_message()
        assert message.topic.value == reply_topic
        reply = json.loads(message.payload)
        published = None
        if publish_trace and reply.get("trace_unavailable") is None:
            trace_message = await caller.next_message()
            assert trace_message.topic.value == f"{reply_topic}/trace"
            assert isinstance(trace_message.payload, bytes)
            published = trace_message.payload
    return reply, dict(getattr(message.properties, "UserProperty", [])), published


def of_trace(spans: list[ReceivedSpan], trace_id: str, service: str = "toolbus") -> list[Any]:
    return [
        s for s in spans if s.trace_id == trace_id and s.resource.get("service.name") == service
    ]


# -- 1. a published trace names the service, nothing else of the operator's resource ------


async def test_a_published_trace_carries_only_the_service_name(
    broker: Broker, exporting: tuple[Serve, Topics], collector: OtlpReceiver
) -> None:
    _, topics = exporting
    reply, _, payload = await call(broker, topics, "echo", {"text": "hi"}, publish_trace=True)
    assert reply["ok"], reply
    assert payload is not None
    document = json.loads(payload)
    resources = [rs.get("resource", {}) for rs in document["resourceSpans"]]
    assert resources and all(
        r == {"attributes": [{"key": "service.name", "value": {"stringValue": "toolbus"}}]}
        for r in resources
    ), resources
    assert OPERATOR_ENVIRONMENT not in payload.decode()
    assert published_spans(payload)
    # The operator's own exporter keeps the whole resource.
    exported = of_trace(
        await collector.wait_for(lambda s: bool(of_trace(s, reply["trace_id"]))),
        reply["trace_id"],
    )
    assert exported[0].resource["deployment.environment"] == OPERATOR_ENVIRONMENT
    assert {"host.name", "process.pid", "telemetry.sdk.version"} <= set(exported[0].resource)


# -- 3. the mcp SDK's CLIENT span, as exported -------------------------------------------


async def test_the_mcp_sdks_span_reaches_the_exporter_without_the_servers_error_text(
    broker: Broker, exporting: tuple[Serve, Topics], collector: OtlpReceiver
) -> None:
    """The context server refuses with a JSON-RPC error quoting the value: the caller's
    reply has it; the operator's exporter gets the SDK's span with its codes alone."""
    _, topics = exporting
    reply, _, _ = await call(broker, topics, "refuse", {"value": SECRET})
    assert reply["error"]["code"] == "tool_error"
    assert SECRET in reply["error"]["message"]
    trace_id = reply["trace_id"]
    sdk_name = "MCP send tools/call refuse"
    received = await collector.wait_for(
        lambda s: (
            any(x.name.startswith("process ") for x in of_trace(s, trace_id))
            and any(x.name == sdk_name for x in of_trace(s, trace_id))
        )
    )
    ours = of_trace(received, trace_id)
    assert not [s.name for s in ours if SECRET.encode() in s.encoded]
    [sdk] = [Span.FromString(s.encoded) for s in ours if s.name == sdk_name]
    assert sdk.status.code == Status.STATUS_CODE_ERROR and sdk.status.message == ""
    attributes = {a.key: a.value.string_value for a in sdk.attributes}
    assert attributes["error.type"] == "-32602"  # the server's code stays
    for event in sdk.events:
        assert event.name != "exception" or {a.key for a in event.attributes} <= {
            "exception.type",
            "exception.escaped",
        }


# -- 2. a caller's sampled flag and the operator's sampler --------------------------------


@pytest.mark.parametrize(
    "sampler",
    [
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
        {"OTEL_TRACES_SAMPLER": "parentbased_always_off"},
    ],
    ids=["ratio_0", "always_off"],
)
async def test_a_callers_sampled_flag_does_not_make_the_operator_export(
    broker: Broker, collector: OtlpReceiver, tmp_path: Path, sampler: dict[str, str]
) -> None:
    """The operator samples nothing. A caller's `traceparent` says sampled: its call joins
    the caller's trace, and is recorded for the caller's own copy when it asks for one
    (`publish_trace`), but the exporter gets none of it: not the worker's spans, not the
    MCP server's (it is passed on the operator's decision, not the caller's)."""
    plain, asked, unflagged = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    async for serve, topics in serving(broker, tmp_path, **exporting_env(collector, **sampler)):
        reply, properties, _ = await call(
            broker, topics, "echo", {"text": "x"}, headers=(("traceparent", traceparent(plain)),)
        )
        assert reply["ok"] and reply["trace_id"] == plain, reply
        assert properties["traceparent"].endswith("-00")  # sampled out, and says so

        reply, _, payload = await call(
            broker,
            topics,
            "get_device_sensor_data",
            {"device_name": "Living Room Lamp"},
            publish_trace=True,
            headers=(("traceparent", traceparent(asked)),),
        )
        assert reply["ok"] and reply["trace_id"] == asked, reply
        assert payload is not None, reply  # the caller's copy still comes
        sent = published_spans(payload)
        assert {s["traceId"] for s in sent} == {asked}
        assert {s["name"].split(" ")[0] for s in sent} >= {"process", "execute_tool", "send"}
        assert "MCP send tools/call get_device_sensor_data" in {s["name"] for s in sent}

        # No sampled flag from the caller: the operator's decision, told as before.
        reply, _, payload = await call(
            broker,
            topics,
            "echo",
            {"text": "y"},
            publish_trace=True,
            headers=(("traceparent", traceparent(unflagged, "00")),),
        )
        assert reply["trace_unavailable"] == "not_sampled" and payload is None, reply
        # A clean stop flushes every span the worker's exporter holds.
        assert await serve.exit_code(stop=True) == 0
    leaked = [
        (s.resource.get("service.name"), s.name)
        for s in collector.spans
        if s.trace_id in {plain, asked, unflagged}
    ]
    assert leaked == []


# -- the operator's sampler, as configured ------------------------------------------------


@pytest.mark.parametrize(
    ("env", "description", "warned"),
    [
        ({}, "ParentBased{root:AlwaysOnSampler", False),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, "AlwaysOffSampler", False),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
            "ParentBased{root:TraceIdRatioBased{0.25}",
            False,
        ),
        ({"OTEL_TRACES_SAMPLER": "bogus"}, "ParentBased{root:AlwaysOnSampler", True),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "TraceIdRatioBased{1.0}",
            True,
        ),
    ],
)
def test_the_operators_sampler_is_read_from_the_environment_given_as_the_sdk_reads_it(
    env: dict[str, str], description: str, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = OperatorSampling(operator_sampler(env))
    assert sampler.get_description().startswith(f"OperatorSampling{{{description}")
    assert bool([r for r in caplog.records if r.name == "toolbus.telemetry"]) == warned
