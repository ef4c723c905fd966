"""One trace from the caller through MQTT, the worker and the demo MCP server, in a real backend.

Arize Phoenix (installed by `make test` into .venv-phoenix) receives OTLP/HTTP from
`toolbus serve` and from the demo server it starts; the test reads the trace back
from Phoenix's REST API.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.cli.test_cli import ROOT, cli_env, wait_ready
from tests.support.harness import Broker, free_port
from tests.support.mqtt import Caller
from tests.support.processes import start_serve, wait_for_line

PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
CALLER_SPAN = "051581bf3cb55c13"
TRACEPARENT = f"00-{TRACE}-{CALLER_SPAN}-01"

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module")
async def phoenix(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    if not PHOENIX.exists():
        pytest.fail("Phoenix is not installed: `make test` installs it into .venv-phoenix")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_WORKING_DIR": str(tmp_path_factory.mktemp("phoenix")),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    proc = await asyncio.create_subprocess_exec(
        str(PHOENIX),
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    # Phoenix imports a large stack and migrates a fresh database before it listens: on a
    # busy two-core machine that took over 120 s once, so the bound is generous.
    await wait_for_line(proc.stdout, b"Uvicorn running", "Phoenix", timeout_s=300)
    drain = asyncio.create_task(_drain(proc.stdout), name="phoenix-log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()
        drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


def spans_of(phoenix: str, trace_id: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{phoenix}/v1/projects/default/spans?limit=1000", timeout=10
    ) as response:
        data = json.load(response)["data"]
    return [s for s in data if s["context"]["trace_id"] == trace_id]


# One call in the schema's shape (the settled fast path), one with a value to shape (the
# full path): each its own trace from the caller.
CALLS = {
    "a" * 32: ("get_device_sensor_data", {"deviceName": "Hallway Sensor"}),
    "b" * 32: (
        "control_zwave_device",
        {"device_name": "Living Room Lamp", "command": "dim", "brightness": "30"},
    ),
}


async def test_one_trace_from_the_caller_to_the_mcp_server(broker: Broker, phoenix: str) -> None:
    prefix = f"otel{uuid.uuid4().hex[:8]}"
    env = {
        **cli_env(prefix),
        "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix,
        "OTEL_SERVICE_NAME": "toolbus-e2e",
        "OTEL_METRICS_EXPORTER": "none",  # Phoenix takes traces only
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    serve = await start_serve(broker.url, env, stderr=asyncio.subprocess.DEVNULL)
    reply_topic = f"{prefix}/reply/e2e"
    try:
        async with Caller(broker.url) as caller:
            await wait_ready(caller, prefix)
            await caller.subscribe(reply_topic)
            for trace_id, (tool, arguments) in CALLS.items():
                await caller.publish(
                    f"{prefix}/call/{tool}",
                    json.dumps({"arguments": arguments}),
                    response_topic=reply_topic,
                    correlation=trace_id.encode(),
                    user_properties=(
                        ("traceparent", TRACEPARENT.replace(TRACE, trace_id)),
                        ("tracestate", "vendor=e2e"),
                        ("baggage", "tenant=kitchen"),
                    ),
                )
                reply = json.loads((await caller.next_message()).payload)
                assert reply["ok"] and reply["trace_id"] == trace_id, reply
    finally:
        serve.send_signal(signal.SIGTERM)  # shutdown flushes the batched spans
        async with asyncio.timeout(30):
            assert await serve.wait() == 0

    for trace_id, (tool, _) in CALLS.items():
        await _check_trace(phoenix, trace_id, prefix, tool, reply_topic)


async def _check_trace(
    phoenix: str, trace_id: str, prefix: str, tool: str, reply_topic: str
) -> None:
    """caller -> process -> execute_tool -> tools/call (ours) -> MCP send (the SDK's) ->
    tools/call (the server's), each link by trace id and parent span id."""
    # Phoenix stores what it accepted asynchronously: no event to wait on, so ask again
    # (bounded) until every span is there: the demo server's, and the worker's, which may
    # come in more than one batch (the `process` span, ended last, in the last one).
    ends = {f"process {prefix}/call/{tool}", f"send {reply_topic}"}
    async with asyncio.timeout(60):
        while True:
            found = await asyncio.to_thread(spans_of, phoenix, trace_id)
            calls = [s for s in found if s["name"] == f"tools/call {tool}"]
            if len(calls) == 2 and ends <= {s["name"] for s in found}:
                break
            await asyncio.sleep(0.5)

    def one(name: str) -> dict[str, Any]:
        [span] = [s for s in found if s["name"] == name]
        return span

    def span_id(span: dict[str, Any]) -> str:
        return str(span["context"]["span_id"])

    assert {s["context"]["trace_id"] for s in found} == {trace_id}
    consumer = one(f"process {prefix}/call/{tool}")
    assert consumer["parent_id"] == CALLER_SPAN
    execute = one(f"execute_tool {tool}")
    assert execute["parent_id"] == span_id(consumer)
    # Ours is the worker's MCP client span; the server's names the protocol it spoke.
    [ours] = [s for s in calls if s["attributes"].get("toolbus.mcp.server") == "devices"]
    [theirs] = [s for s in calls if "mcp.protocol.version" in s["attributes"]]
    assert ours["parent_id"] == span_id(execute)
    assert ours["attributes"]["mcp.method.name"] == "tools/call"
    assert ours["attributes"]["gen_ai.tool.name"] == tool
    sdk = one(f"MCP send tools/call {tool}")  # the SDK's, which writes the request's _meta
    assert sdk["parent_id"] == span_id(ours)
    # The demo server (another process) continued the trace from the request's _meta.
    assert theirs["parent_id"] == span_id(sdk)
    assert theirs["attributes"]["gen_ai.tool.name"] == tool
    assert one(f"send {reply_topic}")["parent_id"] == span_id(consumer)
