"""Seed 001, the tool-execution spec: MCP servers keep stdout for JSON-RPC and log on
stderr; the client stays up when a server breaks either rule; a server out of reach is
`unavailable`. The demo server spoken to directly, and through a worker; a misbehaving
server; the demo server over HTTP, killed."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from mcp_types import LATEST_PROTOCOL_VERSION

from tests.acceptance.parts import call, misbehaving
from tests.harness import DEMO_SERVER, Broker, free_port, make_settings, running_worker
from tests.logwait import LogSeen, watching
from tests.mqtt import Caller
from tests.processes import start_http_demo, stop_process
from toolbus.service import Worker

EXCHANGE_S = 30.0  # the whole direct conversation with the demo server


@dataclass
class Conversation:
    """Everything the demo server wrote while answering initialize, tools/list, a call."""

    stdout: list[bytes] = field(default_factory=list)
    stderr: bytes = b""


async def _answer(
    proc: asyncio.subprocess.Process, request: dict[str, Any], out: list[bytes]
) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    await proc.stdin.drain()
    if "id" not in request:
        return  # a notification has no answer
    while True:
        line = await proc.stdout.readline()
        assert line, f"the server closed stdout: {out!r}"
        out.append(line)
        if json.loads(line).get("id") == request["id"]:
            return


@pytest_asyncio.fixture(scope="module")
async def conversation() -> AsyncIterator[Conversation]:
    """`toolbus demo-server` over stdio, driven by hand as any MCP client would."""
    command = DEMO_SERVER["command"]
    assert isinstance(command, str)
    proc = await asyncio.create_subprocess_exec(
        command,
        *DEMO_SERVER["args"],
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    talk = Conversation()
    requests: list[dict[str, Any]] = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "seed-test", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "control_zwave_device",
                "arguments": {"deviceName": "Switch One", "action": "on"},
            },
        },
    ]
    try:
        async with asyncio.timeout(EXCHANGE_S):
            for request in requests:
                await _answer(proc, request, talk.stdout)
            assert proc.stdin is not None
            proc.stdin.close()  # end of input: the server ends
            rest, talk.stderr = await proc.communicate()
            talk.stdout += rest.splitlines(keepends=True)
    finally:
        await stop_process(proc)
    yield talk


def test_a_server_writes_its_debug_output_to_stderr(conversation: Conversation) -> None:
    """Seed 001_a4be83c33a199967.txt: "Debug logs use stderr"."""
    assert b"control_zwave_device received deviceName, action" in conversation.stderr
    assert not any(b"received deviceName" in line for line in conversation.stdout)


def test_json_rpc_answers_are_lines_on_stdout(conversation: Conversation) -> None:
    """Seed 001_a4be83c33a199967.txt: "JSON-RPC messages use stdout".

    One answer per request, each one newline-delimited JSON object naming its request.
    """
    answers = [json.loads(line) for line in conversation.stdout]
    assert all(line.endswith(b"\n") for line in conversation.stdout)
    assert [a["id"] for a in answers if "id" in a] == [1, 2, 3]
    assert answers[-1]["result"]["structuredContent"]["device"]["state"] == "on"


def test_every_stdout_line_is_json_rpc(conversation: Conversation) -> None:
    """Seed 001_a4be83c33a199967.txt: "Prevent stdout pollution"."""
    assert conversation.stdout
    for line in conversation.stdout:
        assert json.loads(line)["jsonrpc"] == "2.0", line


async def test_a_tools_debug_output_reaches_the_workers_log(
    caller: Caller, demo_worker: Worker
) -> None:
    """Seed 001_a4be83c33a199967.txt: "MCP server debug logs (MODIFIED)".

    While the Z-Wave tool runs, the server's debug line goes to its stderr, which the
    worker relays to its own log (`toolbus.mcp.devices`), the server named in a field.
    """
    with watching("toolbus.mcp.devices", "control_zwave_device received") as relayed:
        reply = await call(
            caller,
            demo_worker,
            "control_zwave_device",
            {"deviceName": "Switch Two", "action": "off"},
        )
        assert reply["ok"], reply
        async with asyncio.timeout(10):
            await relayed.seen.wait()
    [line] = [r for r in relayed.records if "control_zwave_device received" in r.getMessage()]
    assert vars(line)["server"] == "devices"


@dataclass
class Noisy:
    worker: Worker
    complaints: LogSeen


@pytest_asyncio.fixture(scope="module")
async def noisy(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Noisy]:
    """A server that prints a banner on stdout at start, and garbage from its `noisy` tool."""
    state = tmp_path_factory.mktemp("noisy")
    settings = make_settings(broker, mcpServers={"noisy": misbehaving(state, TB_GARBAGE="1")})
    with watching("toolbus.mcp", "not JSON-RPC", logging.WARNING) as complaints:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"noisy": "ready"}
            yield Noisy(worker, complaints)


async def test_a_line_that_is_not_json_rpc_is_shown(caller: Caller, noisy: Noisy) -> None:
    """Seed 001_a4be83c33a199967.txt: "Detect stdout pollution".

    Each such line is logged with its content (its first 200 characters) and counted.
    """
    assert (await call(caller, noisy.worker, "noisy", {"value": "x"}))["ok"]
    shown = [r.getMessage() for r in noisy.complaints.records]
    assert any("Welcome to the misbehaving server" in line for line in shown), shown
    assert noisy.worker.mcp.servers["noisy"].bad_stdout_lines >= 2


async def test_the_session_goes_on_after_a_bad_line(caller: Caller, noisy: Noisy) -> None:
    """Seed 001_a4be83c33a199967.txt: "Continue operation after parse error"."""
    server = noisy.worker.mcp.servers["noisy"]
    polluted = await call(caller, noisy.worker, "noisy", {"value": "y"})
    after = await call(caller, noisy.worker, "work", {"value": "after"})
    assert polluted["result"]["text"] == "clean y" and after["result"]["text"] == "did after"
    assert (server.state, server.connects) == ("ready", 1)


async def test_a_server_out_of_reach_is_unavailable(broker: Broker, caller: Caller) -> None:
    """Seed 001_a4be83c33a199967.txt: "Network error".

    The demo server over HTTP, killed: its tool's call is answered `unavailable`, naming
    the server, and the worker's other tools go on.
    """
    port = free_port()
    server = await start_http_demo(port)
    settings = make_settings(broker, mcpServers={"remote": {"url": f"http://127.0.0.1:{port}/mcp"}})
    try:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"remote": "ready"}
            await stop_process(server)
            reply = await call(
                caller, worker, "control_zwave_device", {"deviceName": "Switch One", "action": "on"}
            )
            assert reply["error"]["code"] == "unavailable", reply
            assert reply["error"]["details"]["server"] == "remote"
            assert (await call(caller, worker, "echo", {"text": "still here"}))["ok"]
    finally:
        await stop_process(server)
