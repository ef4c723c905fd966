"""MCP backend against real servers: stdio and streamable HTTP, stderr routing, a killed server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.support.harness import DEMO_SERVER, Broker, free_port, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from tests.support.processes import start_http_demo, stop_process
from toolbus.backends.local.functions import tool


@pytest_asyncio.fixture
async def http_demo_server() -> AsyncIterator[str]:
    port = free_port()
    proc = await start_http_demo(port)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await stop_process(proc)


async def test_streamable_http_server(
    broker: Broker, caller: Caller, http_demo_server: str
) -> None:
    settings = make_settings(broker, mcpServers={"http_devices": {"url": http_demo_server}})
    async with running_worker(settings) as worker:
        assert worker.mcp.states() == {"http_devices": "ready"}
        # The newest version both speak (the demo server serves either era; issue 32).
        assert worker.mcp.servers["http_devices"].protocol_version == "2026-07-28"
        reply = await caller.call_tool(
            worker.topics, "control_zwave_device", {"device_name": "Switch One", "command": "off"}
        )
        assert reply["ok"], reply
        assert reply["result"]["structured"]["received"] == {
            "deviceName": "Switch One",
            "action": "off",
        }


async def test_unreachable_http_server_is_down_not_fatal(broker: Broker, caller: Caller) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    settings = make_settings(broker, mcpServers={"gone": {"url": url, "connect_timeout_s": 5}})
    async with running_worker(settings) as worker:
        assert worker.mcp.states() == {"gone": "down"}
        assert (await caller.call_tool(worker.topics, "echo", {"text": "x"}))["ok"]


def demo_server_pids(mark: str) -> list[int]:
    """Our own children running the demo server with `TB_MARK=mark` (found through /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and f"TB_MARK={mark}".encode() in environ:
            pids.append(int(entry.name))
    return pids


async def test_server_stderr_reaches_the_log(broker: Broker, caller: Caller) -> None:
    settings = make_settings(broker, mcpServers={"logged": DEMO_SERVER})
    with watching("toolbus.mcp.logged", "control_zwave_device received") as server_log:
        async with running_worker(settings) as worker:
            reply = await caller.call_tool(
                worker.topics, "control_zwave_device", {"deviceName": "Switch Two", "action": "on"}
            )
            assert reply["ok"]
            async with asyncio.timeout(10):
                await server_log.seen.wait()
            tail = worker.mcp.servers["logged"].stderr_tail
            assert any("control_zwave_device received" in line for line in tail)
    # Each line names its server (a terminal line shows no logger name).
    assert {vars(r)["server"] for r in server_log.records} == {"logged"}


async def test_killed_stdio_server_gives_unavailable_not_a_hang(
    broker: Broker, caller: Caller
) -> None:
    mark = uuid.uuid4().hex
    settings = make_settings(
        broker, mcpServers={"victim": {**DEMO_SERVER, "env": {"TB_MARK": mark}}}
    )
    async with running_worker(settings) as worker:
        pids = demo_server_pids(mark)
        assert len(pids) == 1
        os.kill(pids[0], signal.SIGKILL)
        began = time.monotonic()
        reply = await caller.call_tool(worker.topics, "list_devices", {}, wait_s=10)
        took_s = time.monotonic() - began
        assert reply["error"]["code"] == "unavailable"
        assert took_s < 2.0, f"unavailable after {took_s:.2f} s, not at once"
        assert reply["error"]["details"]["server"] == "victim"
        # The worker itself carries on.
        assert (await caller.call_tool(worker.topics, "echo", {"text": "x"}))["ok"]


@tool(name="list_devices")
async def local_list_devices() -> str:
    """A local tool with the name the demo server's tool has."""
    return "the local list"


async def test_a_local_tool_keeps_its_name_and_the_mcp_tool_is_qualified(
    broker: Broker, caller: Caller
) -> None:
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER})
    with watching("toolbus.registry", "both expose", logging.WARNING) as collision:
        async with running_worker(settings, [local_list_devices]) as worker:
            local = await caller.call_tool(worker.topics, "list_devices", {})
            assert (local["tool"], local["result"]["text"]) == ("list_devices", "the local list")
            remote = await caller.call_tool(worker.topics, "devices.list_devices", {})
            assert remote["tool"] == "devices.list_devices" and remote["ok"], remote
            assert remote["result"]["text"] != "the local list"
            listed = {t["name"]: t["origin"] for t in await caller.list_tools(worker.topics)}
            assert listed["list_devices"] == "local"
            assert listed["devices.list_devices"] == "mcp:devices"
    assert [r.levelno for r in collision.records] == [logging.WARNING]
