"""What a worker loads before its first call, and what it answers before the rest is in.

Building a worker imports neither the mcp SDK (about a second) nor, with no `OTEL_*`
exporter configured, the OTLP exporters, protobuf or the metrics SDK: `toolbus serve`
answers its first local call sooner (`bench/cold_start.py`). A worker with an MCP server
imports the SDK in a thread once it runs, and meanwhile answers its local tools, and
calls for the server's tools as it would while the server connects.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

import toolbus.backends.mcp.backend as backend
from tests.support.harness import Broker, make_settings, running_worker
from toolbus import Client
from toolbus.wire.errors import Unavailable
from toolbus.worker.http import readiness
from toolbus.worker.status_page import snapshot

if TYPE_CHECKING:
    from toolbus.backends.mcp.server import McpServer

DEMO = {"command": sys.executable, "args": ["-m", "toolbus", "demo-server"]}
BOUND_S = 30.0

# What `toolbus serve` does before it connects (cli/main.py `_serve`), then which of the
# modules it should not need are loaded.
PROBE = """
import json, os, sys
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.backends.local.functions import load_entry_points
from toolbus.config import Settings
from toolbus.observability.sdk import child_environment, configure_metrics, configure_tracing
from toolbus.worker.wiring import build_worker
for servers in json.loads(sys.argv[1]):  # one worker each: what they loaded, together
    settings = Settings(broker_url="mqtt://127.0.0.1:1", mcpServers=servers)
    configure_tracing(record_for_callers=settings.publish_traces)
    configure_metrics()
    tools = [*BUILTIN_TOOLS, *load_entry_points()]
    build_worker(settings, tools, child_env=child_environment())
loaded = set(sys.modules)
print(json.dumps({
    "mcp": "mcp" in loaded,
    "otlp": any(m.startswith("opentelemetry.exporter") for m in loaded),
    "protobuf": "google.protobuf" in loaded,
    "metrics sdk": "opentelemetry.sdk.metrics" in loaded,
    "tenacity": "tenacity" in loaded,
}), flush=True)
os._exit(0)  # no exit handlers: a configured exporter would flush to a collector not there
"""


def loaded(*servers: Mapping[str, object], **env: str) -> dict[str, bool]:
    """What a fresh interpreter has loaded after building a worker for each `servers`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TOOLBUS_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(servers)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**clean, **env},
    )
    result: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_worker_is_built_without_what_its_first_local_call_does_not_need() -> None:
    """Not the mcp SDK, even with a server (it loads in the background once the worker
    runs); no exporter, protobuf or metrics SDK without an `OTEL_*` exporter; no tenacity
    (the MCP retries', the Redis store's). No server, one disabled, one enabled."""
    disabled = {"off": {"command": "true", "disabled": True}}
    assert loaded({}, disabled, {"demo": DEMO}) == dict.fromkeys(
        ["mcp", "otlp", "protobuf", "metrics sdk", "tenacity"], False
    )


def test_an_otlp_exporter_configured_is_loaded() -> None:
    """The other side: `OTEL_*` asking for OTLP gets the exporters (and the metrics SDK)."""
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
    seen = loaded({}, **otlp)
    assert seen["otlp"] and seen["protobuf"] and seen["metrics sdk"]


@pytest.fixture
def held_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The MCP servers' import held until the event is set (bounded): a slow import."""
    release = threading.Event()
    load = backend.load_servers

    def held() -> type[McpServer]:
        release.wait(BOUND_S)
        return load()

    monkeypatch.setattr(backend, "load_servers", held)
    yield release
    release.set()  # the import's thread ends, whatever the test did


async def test_local_calls_are_answered_while_the_mcp_sdk_loads(
    broker: Broker, held_sdk: threading.Event
) -> None:
    """While the SDK loads: `echo` answered; the server's tool answered `unavailable`
    naming it, as while it connects; the server `connecting` everywhere it is shown.
    Once loaded, the server starts and its tool answers."""
    settings = make_settings(broker, mcpServers={"demo": DEMO})
    async with (
        running_worker(settings, wait_mcp=False) as worker,
        Client(broker.url, prefix=settings.topic_prefix, timeout_s=BOUND_S) as client,
    ):
        started = time.perf_counter()
        echoed = (await client.call("echo", {"text": "hi"})).result
        assert echoed is not None and json.loads(echoed.text)["text"] == "hi"
        took_s = time.perf_counter() - started
        with pytest.raises(Unavailable) as early:
            await client.call("list_devices", timeout_s=0.5)
        assert early.value.details["servers"] == ["demo"]
        assert worker.mcp.servers == {}  # not made yet: the import is held
        assert worker.mcp.unsettled() == ["demo"]
        assert worker.mcp.states() == {"demo": "connecting"}
        assert readiness(worker)["servers"] == {"demo": {"state": "connecting", "last_error": None}}
        page = snapshot(worker, started)
        assert page["servers"] == [
            {"name": "demo", "state": "connecting", "last_error": None, "tools": 0}
        ]
        assert page["fleet"][-1]["servers"] == {"demo": "connecting"}
        held_sdk.set()
        async with asyncio.timeout(BOUND_S):
            await worker.mcp.wait_settled()
        assert worker.mcp.states() == {"demo": "ready"}
        listed = (await client.call("list_devices")).result
        assert listed is not None and listed.structured is not None
    print(f"echo answered in {took_s * 1000:.0f} ms while the SDK was held")


async def test_a_worker_stopped_while_the_mcp_sdk_loads_stops_at_once(
    broker: Broker, held_sdk: threading.Event
) -> None:
    """No server was made: the stop neither waits for the import nor starts one."""
    settings = make_settings(broker, mcpServers={"demo": DEMO})
    async with asyncio.timeout(BOUND_S / 2):  # the held import would take BOUND_S
        async with running_worker(settings, wait_mcp=False) as worker:
            assert worker.mcp.unsettled() == ["demo"]
    assert worker.mcp.servers == {}
    assert not held_sdk.is_set()  # the stop did not wait for the import


async def test_an_mcp_sdk_that_does_not_load_leaves_its_servers_down_saying_why(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken install: the worker serves its local tools on, and every server is `down`
    with the import's error wherever it is shown, settled (nothing waits for it)."""

    def broken() -> type[McpServer]:
        raise ImportError("No module named 'mcp.client' (a broken install)")

    monkeypatch.setattr(backend, "load_servers", broken)
    settings = make_settings(broker, mcpServers={"demo": DEMO})
    async with (
        running_worker(settings, wait_mcp=False) as worker,
        Client(broker.url, prefix=settings.topic_prefix, timeout_s=BOUND_S) as client,
    ):
        async with asyncio.timeout(BOUND_S):
            await worker.mcp.wait_settled()
        assert worker.mcp.unsettled() == [] and worker.mcp.states() == {"demo": "down"}
        [(name, summary)] = worker.mcp.summaries().items()
        assert name == "demo" and summary.state == "down" and summary.tools == 0
        assert summary.last_error is not None and "a broken install" in summary.last_error
        assert readiness(worker)["servers"]["demo"]["state"] == "down"
        echoed = (await client.call("echo", {"text": "on"})).result
        assert echoed is not None and json.loads(echoed.text)["text"] == "on"
