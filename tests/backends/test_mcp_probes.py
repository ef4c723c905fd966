"""The health probe of an HTTP MCP session tells the peer's words from the transport's.

toolbus asks an HTTP server `ping` (2025-11-25) or `server/discover` (2026-07-28) every
`[mcp].health_interval_s` to notice a lost session. A server that answers it with an
ordinary JSON-RPC error is there: it said so. Before, any error answer ended the session,
cut every call in flight on it and reconnected, at every probe. A server that no longer
knows the session (HTTP 404 on its session id: a restarted server) is still lost.

Real processes: a broker, the worker in-process, and `servers/probe_refuser.py` (the
SDK's server behind an ASGI layer that refuses the probe) on a free port.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import Broker, free_port, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from tests.support.processes import stop_process, wait_for_line
from toolbus.worker.service import Worker

ROOT = Path(__file__).parents[2]
MODERN, LEGACY = "2026-07-28", "2025-11-25"
PROBES_HELD = 3  # refused probes a call stays in flight across
HEALTH_S = 0.05


@asynccontextmanager
async def refuser(port: int, *flags: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.servers.probe_refuser",
        "--port",
        str(port),
        *flags,
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        await wait_for_line(proc.stderr, b"Uvicorn running", "the probe refuser")
        yield proc
    finally:
        await stop_process(proc)


@asynccontextmanager
async def worker_of(broker: Broker, port: int) -> AsyncIterator[Worker]:
    settings = make_settings(
        broker,
        mcp={
            "startup_base_delay_s": 0.05,
            "recovery_max_delay_s": 0.2,
            "health_interval_s": HEALTH_S,
        },
        mcpServers={"web": {"url": f"http://127.0.0.1:{port}/mcp", "connect_timeout_s": 5}},
    )
    async with running_worker(settings) as worker:
        yield worker


async def call(caller: Caller, worker: Worker, tool: str, **arguments: Any) -> dict[str, Any]:
    return await caller.call_tool(worker.topics, tool, arguments, wait_s=30)


def structured(reply: dict[str, Any]) -> Any:
    assert reply["ok"], reply
    return reply["result"]["structured"]


@pytest.mark.parametrize(
    ("era", "flags"),
    [
        (LEGACY, ("--legacy", "--code", "-32601")),  # a server without `ping`
        (MODERN, ("--code", "-32000")),  # a server error of its own to server/discover
    ],
    ids=["ping-method-not-found", "discover-server-error"],
)
async def test_a_probe_answered_with_an_error_keeps_the_session(
    broker: Broker, era: str, flags: tuple[str, ...]
) -> None:
    port = free_port()
    async with (
        refuser(port, *flags),
        worker_of(broker, port) as worker,
        Caller(broker.url) as caller,
    ):
        server = worker.mcp.servers["web"]
        assert server.protocol_version == era
        with watching("toolbus.mcp", level=logging.DEBUG) as log:
            # In flight while PROBES_HELD probes are refused: it answers only after them.
            held = await call(caller, worker, "hold", probes=PROBES_HELD)
        assert structured(held)["refused"] >= PROBES_HELD
        assert (server.state, server.connects, server.protocol_version) == ("ready", 1, era)
        assert structured(await call(caller, worker, "sessions")) == {"sessions": 1}
        refusals = [r for r in log.records if r.getMessage() == "mcp probe answered with an error"]
        assert len(refusals) == 1  # told once per session, not at every probe
        assert getattr(refusals[0], "mcp_code", None) == int(flags[-1])
        assert not [r for r in log.records if r.getMessage() == "mcp server lost"]


async def test_a_calls_own_server_error_is_its_answer_when_the_probe_is_refused(
    broker: Broker,
) -> None:
    """A call answered -32000 over HTTP is told from a lost connection by a probe
    (`call.failure`); a probe answered "method not found" says the server is there: the
    call gets `tool_error` with the server's code, and the session goes on."""
    port = free_port()
    flags = ("--legacy", "--code", "-32601")
    async with (
        refuser(port, *flags),
        worker_of(broker, port) as worker,
        Caller(broker.url) as caller,
    ):
        server = worker.mcp.servers["web"]
        reply = await call(caller, worker, "busy")
        assert not reply["ok"] and reply["error"]["code"] == "tool_error", reply
        assert reply["error"]["details"]["mcp_code"] == -32000
        assert (server.state, server.connects) == ("ready", 1)
        assert structured(await call(caller, worker, "sessions")) == {"sessions": 1}


async def test_a_modern_server_that_refuses_subscriptions_listen_still_serves(
    broker: Broker,
) -> None:
    """`subscriptions/listen` answered with an error: the session opens without a list
    change stream. Before, the opening failed, again at every retry: the server stayed
    `down` and its tools `unavailable`."""
    port = free_port()
    with watching("toolbus.mcp", "refused subscriptions/listen") as log:
        async with (
            refuser(port, "--refuse-listen", "-32601"),
            worker_of(broker, port) as worker,
            Caller(broker.url) as caller,
        ):
            server = worker.mcp.servers["web"]
            assert (server.state, server.protocol_version, server.connects) == ("ready", MODERN, 1)
            assert structured(await call(caller, worker, "sessions")) == {"sessions": 1}
    refused = [
        r for r in log.records if r.getMessage() == "mcp server refused subscriptions/listen"
    ]
    assert [getattr(r, "mcp_code", None) for r in refused] == [-32601]


async def test_a_legacy_server_that_forgot_the_session_is_reconnected(broker: Broker) -> None:
    """HTTP 404 on the session's id (with the server's own JSON-RPC error in the body, as
    the SDK's servers answer): the transport's word, whatever the body says. The session
    is lost and opened afresh, as before."""
    port = free_port()
    async with (
        refuser(port, "--legacy"),
        worker_of(broker, port) as worker,
        Caller(broker.url) as caller,
    ):
        server = worker.mcp.servers["web"]
        assert (server.protocol_version, server.connects) == (LEGACY, 1)
        with watching("toolbus.mcp", "mcp server lost", level=logging.WARNING) as log:
            assert (await call(caller, worker, "forget"))["ok"]
            async with asyncio.timeout(10):
                await log.seen.wait()
        async with asyncio.timeout(10):
            while server.state != "ready" or server.connects < 2:
                await asyncio.sleep(0.02)  # polled, bounded: the state has no event of its own
        assert structured(await call(caller, worker, "sessions")) == {"sessions": 2}
