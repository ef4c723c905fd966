"""What a caller gets back on `{reply_topic}/trace`, from a real `toolbus serve` on a real
broker: no argument value and no trace of the worker's install in what it receives, or in
what the worker exports; and a request for spans that no trace can answer is told so.

The worker is a `toolbus serve` process with the demo device server, exporting to a
stand-in collector (`tests/support/otlp.py`) or to nothing at all; the caller is a plain MQTT v5
client that asks for its spans with `publish_trace: true`.
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

from tests.support.harness import DEMO_SERVER, SPAN_ENDS, Broker, make_settings, running_worker
from tests.support.mqtt import Caller, call_topic, reply_topic_for
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.processes import RUN_BOUND_S, Serve, serve_env
from toolbus.wire.topics import Topics

SECRET = "hunter2-S3CRET"
CONTEXT_SERVER = {
    "command": sys.executable,
    "args": [str(Path(__file__).parents[1] / "support" / "servers" / "context_server.py")],
}
# What would show the worker's install or a Python stack to a caller.
INSTALL_MARKS = ("Traceback", 'File "', "site-packages", ".py", "exception.stacktrace")
WORKER_SERVICE = "toolbus"  # the demo server exports as a service of its own


async def serving(
    broker: Broker, tmp_path: Path, **otel: str
) -> AsyncIterator[tuple[Serve, Topics]]:
    """`toolbus serve` with the demo device server under a prefix of its own, ready."""
    prefix = f"pt{uuid.uuid4().hex[:8]}"
    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"devices": DEMO_SERVER}}))
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
                if status["servers"].get("devices", {}).get("state") == "ready":
                    break
        yield serve, topics


@pytest_asyncio.fixture(scope="module")
async def exporting(
    broker: Broker, collector: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Serve, Topics]]:
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # exported at once, not in 5 s batches
    }
    async for served in serving(broker, tmp_path_factory.mktemp("exporting"), **otel):
        yield served


@pytest_asyncio.fixture(scope="module")
async def bare(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Serve, Topics]]:
    async for served in serving(broker, tmp_path_factory.mktemp("bare")):  # no OTEL_*
        yield served


async def call_for_trace(
    broker: Broker, topics: Topics, tool: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """The reply, and the trace published after it, to a call that asked for its spans."""
    reply_topic = reply_topic_for(topics)
    async with Caller(broker.url) as caller:
        await caller.subscribe(f"{reply_topic}/trace")
        reply, _ = await caller.call(
            call_topic(topics, tool),
            {"arguments": arguments, "publish_trace": True},
            reply_topic=reply_topic,
        )
        published = await caller.next_message()
    assert published.topic.value == f"{reply_topic}/trace"
    assert isinstance(published.payload, bytes)
    return reply, published.payload


def published_spans(payload: bytes) -> list[dict[str, Any]]:
    document = json.loads(payload)
    return [s for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        # A string to an integer parameter: the worker's schema check refuses it.
        (
            "control_zwave_device",
            {"device_name": "Kitchen Light", "command": "dim", "brightness": SECRET},
            "invalid_arguments",
        ),
        # The tool itself refuses it, from inside its own code (a stack of the tool's).
        ("datetime", {"timezone": f"{SECRET}/Nowhere"}, "invalid_arguments"),
        # The MCP server's tool fails, quoting the value in its text.
        ("get_device_sensor_data", {"device_name": SECRET}, "tool_error"),
    ],
)
async def test_a_refused_value_reaches_neither_the_published_trace_nor_the_exporter(
    broker: Broker,
    exporting: tuple[Serve, Topics],
    collector: OtlpReceiver,
    tool: str,
    arguments: dict[str, Any],
    code: str,
) -> None:
    serve, topics = exporting
    reply, payload = await call_for_trace(broker, topics, tool, arguments)
    assert reply["error"]["code"] == code
    trace_id = reply["trace_id"]
    text = payload.decode()
    assert SECRET not in text
    assert not [mark for mark in INSTALL_MARKS if mark in text]
    sent = published_spans(payload)
    failed = [s for s in sent if s["name"].startswith("execute_tool")]
    assert failed, [s["name"] for s in sent]
    for span in failed:  # the code says what happened; the status names no value
        assert span["status"]["code"] == 2  # ERROR
        attributes = {a["key"]: a["value"] for a in span.get("attributes", [])}
        assert attributes["error.type"] == {"stringValue": code}

    def ours(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [
            s
            for s in spans
            if s.trace_id == trace_id and s.resource.get("service.name") == WORKER_SERVICE
        ]

    exported = ours(
        await collector.wait_for(lambda spans: any(s.name.startswith("send ") for s in ours(spans)))
    )
    assert {s.name.split(" ")[0] for s in exported} >= {"process", "execute_tool", "send"}
    assert not [s.name for s in exported if SECRET.encode() in s.encoded]
    assert not [s.name for s in exported if b"exception.stacktrace" in s.encoded]
    # Nor in the worker's log (`log_arguments` is off); an MCP server's own stderr, which
    # the worker relays as `toolbus.mcp.{server}`, says what that server chooses to.
    logged = [line for line in serve.output.splitlines() if SECRET in line]
    assert [line for line in logged if '"logger":"toolbus.mcp.' not in line] == []


async def test_an_mcp_servers_refusal_reaches_the_caller_without_its_text_or_stack(
    broker: Broker, spans: Any
) -> None:
    """A server's JSON-RPC error quoting the value: the caller's reply has it (its own
    value, its own answer); the trace it asked for has the failure's codes alone (the mcp
    SDK's span describes it with the server's text); the worker's own spans have neither
    text nor stack."""
    settings = make_settings(broker, mcpServers={"context": CONTEXT_SERVER})
    async with running_worker(settings) as worker:
        reply, payload = await call_for_trace(broker, worker.topics, "refuse", {"value": SECRET})
    assert reply["error"]["code"] == "tool_error"
    assert SECRET in reply["error"]["message"]
    text = payload.decode()
    assert SECRET not in text
    assert not [mark for mark in INSTALL_MARKS if mark in text]
    # The SDK's own span described its failure with the server's text: its code stays.
    [sdk] = [s for s in published_spans(payload) if s["name"] == "MCP send tools/call refuse"]
    assert sdk["status"] == {"code": 2}

    def mine() -> list[Any]:
        return [
            s
            for s in spans.get_finished_spans()
            if format(s.context.trace_id, "032x") == reply["trace_id"]
        ]

    await SPAN_ENDS.until(lambda: any(s.name.startswith("process ") for s in mine()))
    ours = [s for s in mine() if s.instrumentation_scope.name.startswith("toolbus")]
    assert {s.name for s in ours} >= {"execute_tool refuse", "tools/call refuse"}
    for span in ours:
        assert [e.name for e in span.events] == []
        assert SECRET not in (span.status.description or "")


async def test_a_worker_that_records_nothing_says_why_no_trace_follows(
    broker: Broker, bare: tuple[Serve, Topics]
) -> None:
    """No exporter and `publish_traces` off: the reply says `not_recording`, and nothing
    comes on `{reply_topic}/trace` (the next call's reply arrives first)."""
    _, topics = bare
    reply_topic = f"{topics.prefix}/reply/{uuid.uuid4().hex[:8]}"
    async with Caller(broker.url) as caller:
        await caller.subscribe(f"{reply_topic}/trace")
        reply, _ = await caller.call(
            call_topic(topics, "echo"),
            {"arguments": {"text": "x"}, "publish_trace": True},
            reply_topic=reply_topic,
        )
        assert reply["ok"] and reply["trace_unavailable"] == "not_recording"
        plain, _ = await caller.call(
            call_topic(topics, "echo"), {"arguments": {"text": "y"}}, reply_topic=reply_topic
        )
        assert "trace_unavailable" not in plain or plain["trace_unavailable"] is None
        assert caller.unclaimed() == []  # no trace came before the second reply
