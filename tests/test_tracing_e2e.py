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

from tests.harness import Broker, free_port
from tests.mqtt import Caller
from tests.processes import start_serve, wait_for_line
from tests.test_cli import ROOT, cli_env, wait_ready

PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
TRACEPARENT = f"00-{TRACE}-051581bf3cb55c13-01"

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
    try:
        async with Caller(broker.url) as caller:
            await wait_ready(caller, prefix)
            reply_topic = f"{prefix}/reply/e2e"
            await caller.subscribe(reply_topic)
            body = {"arguments": {"device_name": "Hallway Sensor"}}
            await caller.publish(
                f"{prefix}/call/get_device_sensor_data",
                json.dumps(body),
                response_topic=reply_topic,
                correlation=b"e2e",
                user_properties=(("traceparent", TRACEPARENT),),
            )
            reply = json.loads((await caller.next_message()).payload)
        assert reply["ok"] and reply["trace_id"] == TRACE
    finally:
        serve.send_signal(signal.SIGTERM)  # shutdown flushes the batched spans
        async with asyncio.timeout(30):
            assert await serve.wait() == 0

    # Phoenix stores what it accepted asynchronously: no event to wait on, so ask again
    # (bounded) until the demo server's span, the last to arrive, is there.
    async with asyncio.timeout(60):
        while True:
            found = await asyncio.to_thread(spans_of, phoenix, TRACE)
            by_id = {s["context"]["span_id"]: s for s in found}
            calls = [s for s in found if s["name"] == "tools/call get_device_sensor_data"]
            if len(calls) == 2:
                break
            await asyncio.sleep(0.5)

    def parent(span: dict[str, Any]) -> dict[str, Any]:
        return by_id[span["parent_id"]]

    consumer = next(
        s for s in found if s["name"] == f"process {prefix}/call/get_device_sensor_data"
    )
    assert consumer["parent_id"] == "051581bf3cb55c13"  # the caller's span
    ours = next(s for s in calls if s["attributes"].get("toolbus.mcp.server") == "devices")
    theirs = next(s for s in calls if s is not ours)
    assert parent(ours)["name"] == "execute_tool get_device_sensor_data"
    assert parent(parent(ours)) is consumer
    # The demo server (another process) continued the trace from the request's _meta.
    assert parent(theirs)["name"] == "MCP send tools/call get_device_sensor_data"
    assert parent(parent(theirs)) is ours
    assert any(s["name"] == f"send {reply_topic}" for s in found)
