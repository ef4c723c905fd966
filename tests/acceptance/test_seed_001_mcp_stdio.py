"""Seed 001, the tool-execution spec: MCP servers keep stdout for JSON-RPC and log on
stderr; the client stays up when a server breaks either rule; a server out of reach is
`unavailable`. The demo server and a third-party one (server-everything, TypeScript SDK)
spoken to directly; the demo server through a worker; a misbehaving server; the demo
server over HTTP, killed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from mcp_types import LATEST_PROTOCOL_VERSION

from tests.acceptance.parts import call, misbehaving
from tests.support.harness import DEMO_SERVER, Broker, free_port, make_settings, running_worker
from tests.support.logwait import LogSeen, watching
from tests.support.mqtt import Caller
from tests.support.processes import start_http_demo, stop_process
from toolbus.worker.service import Worker

EXCHANGE_S = 30.0  # the whole direct conversation with a server
EXIT_S = 5.0  # for a server to end once its stdin closes, before it is killed


@dataclass(frozen=True)
class Server:
    """An MCP server to speak to directly: how to start it, a call, what it logs."""

    argv: tuple[str, ...]
    call: dict[str, Any]  # tools/call params
    debug_line: bytes  # diagnostic output it writes (on stderr, as it must)
    answered: Callable[[dict[str, Any]], bool]  # the call's result is right


def _server(kind: str, request: pytest.FixtureRequest) -> Server:
    if kind == "demo":
        return Server(
            (str(DEMO_SERVER["command"]), *DEMO_SERVER["args"]),
            {
                "name": "control_zwave_device",
                "arguments": {"deviceName": "Switch One", "action": "on"},
            },
            b"control_zwave_device received deviceName, action",
            lambda result: result["structuredContent"]["device"]["state"] == "on",
        )
    everything = request.getfixturevalue("everything_server")  # third-party: TypeScript SDK
    return Server(
        (everything["command"], *everything["args"]),
        {"name": "get-sum", "arguments": {"a": 2, "b": 3}},
        b"Starting default (STDIO) server",
        lambda result: result["content"][0]["text"] == "The sum of 2 and 3 is 5.",
    )


@dataclass
class Conversation:
    """Everything a server wrote while answering initialize, tools/list and a call."""

    server: Server
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


@pytest_asyncio.fixture(scope="module", params=["demo", "everything"])
async def conversation(request: pytest.FixtureRequest) -> AsyncIterator[Conversation]:
    """An MCP server over stdio (toolbus's demo server; the MCP project's reference
    server-everything), driven by hand as any MCP client would."""
    server = _server(request.param, request)
    proc = await asyncio.create_subprocess_exec(
        *server.argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    talk = Conversation(server)
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
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": server.call},
    ]
    try:
        async with asyncio.timeout(EXCHANGE_S):
            for message in requests:
                await _answer(proc, message, talk.stdout)
            assert proc.stdin is not None
            proc.stdin.close()  # end of input: a server ends, or is ended
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EXIT_S):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
            rest, talk.stderr = await proc.communicate()
            talk.stdout += rest.splitlines(keepends=True)
    finally:
        await stop_process(proc)
    yield talk


def test_a_server_writes_its_debug_output_to_stderr(conversation: Conversation) -> None:
    """Seed 001_a4be83c33a199967.txt: "Debug logs use stderr".

    Shown by toolbus's demo server and by a third-party one (TypeScript SDK).
    """
    line = conversation.server.debug_line
    assert line in conversation.stderr
    assert not any(line in out for out in conversation.stdout)


def test_json_rpc_answers_are_lines_on_stdout(conversation: Conversation) -> None:
    """Seed 001_a4be83c33a199967.txt: "JSON-RPC messages use stdout".

    One answer per request, each one newline-delimited JSON object naming its request.
    """
    answers = [json.loads(line) for line in conversation.stdout]
    assert all(line.endswith(b"\n") for line in conversation.stdout)
    assert [a["id"] for a in answers if "id" in a] == [1, 2, 3]
    assert conversation.server.answered(answers[-1]["result"]), answers[-1]


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
