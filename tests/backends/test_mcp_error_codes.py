"""An MCP server's error answer costs one call; only a connection that is over costs them all.

-32000 and -32001 are JSON-RPC's first implementation-defined server errors, and also
the codes the mcp SDK gives its own outcomes ("connection closed", "request timed
out"). A server answering a call with one of them (the Python SDK does, for a tool
raising `MCPError(-32000, ...)`) has answered that call: its caller gets `tool_error`
with `mcp_code`, the server is not restarted, and another caller's calls in flight on
the same server finish. A server that really dies still fails every call in flight
`unavailable` and is started again, over stdio and over HTTP.

Real processes throughout: the misbehaving test server (tests/support/servers/), over
stdio and over streamable HTTP, a real mosquitto, a worker, two MQTT callers. Waits are
on events: a reply, a retained status message, a server-side count of held calls.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from mcp.shared.exceptions import MCPError

from tests.backends.test_mcp_faults import SERVER, ServerStates, call, misbehaving
from tests.support.harness import Broker, free_port, make_settings, measured, running_worker
from tests.support.mqtt import Caller
from tests.support.processes import stop_process, wait_for_line
from toolbus.backends.mcp.call import failure
from toolbus.backends.mcp.session import Session
from toolbus.worker.service import Worker

IN_FLIGHT = 10  # another caller's calls held on the server when the error answer comes
REPEATS = 20  # error answers in a row: none may restart the server
CODES = [-32000, -32001]  # the SDK's CONNECTION_CLOSED and REQUEST_TIMEOUT


def holding(other: Caller, worker: Worker, gate: str) -> list[asyncio.Task[dict[str, Any]]]:
    """`IN_FLIGHT` calls of `hold` from `other`, each waiting on the server at `gate`."""
    return [
        asyncio.create_task(call(other, worker, "hold", {"value": str(n), "gate": gate}))
        for n in range(IN_FLIGHT)
    ]


def error_of(reply: dict[str, Any]) -> tuple[str, int | None]:
    """A failed reply's code and `mcp_code` ("ok" for a success)."""
    if reply["ok"]:
        return "ok", None
    return reply["error"]["code"], reply["error"]["details"].get("mcp_code")


def starts(state: Path) -> int:
    """How many times the server process was started (it counts them itself)."""
    return int((state / "starts").read_text())


async def one_answer_and_the_others(
    failing: Caller, other: Caller, worker: Worker, code: int, gate: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`IN_FLIGHT` calls from `other` held on the server, then `failing`'s call answered
    with `code`, then the held calls let go: the error reply and theirs."""
    held = holding(other, worker, gate)
    failed = await call(
        failing, worker, "fail_with", {"code": code, "after_held": IN_FLIGHT, "gate": gate}
    )
    await call(failing, worker, "release", {"gate": gate})  # a restarted server has none held
    async with asyncio.timeout(30):
        return failed, list(await asyncio.gather(*held))


@pytest.mark.parametrize("code", CODES)
async def test_an_error_answer_is_tool_error_and_costs_no_other_call(
    broker: Broker, tmp_path: Path, code: int
) -> None:
    settings = make_settings(broker, mcpServers={"coded": misbehaving(tmp_path)})
    async with (
        Caller(broker.url) as failing,
        Caller(broker.url) as other,
        running_worker(settings) as worker,
    ):
        states = ServerStates(failing, worker, "coded")
        await states.until("ready")  # from here on every change arrives, in order
        failed, others = await one_answer_and_the_others(failing, other, worker, code, "g")
        if failed["error"]["code"] == "unavailable":  # it cost the server: wait for it back
            await states.until("ready")
        lost = sum(1 for reply in others if not reply["ok"])
        measured(
            f"MCP {code}: other callers' in-flight calls failed by one such answer: "
            f"{lost}/{IN_FLIGHT}; the answer itself: {error_of(failed)}"
        )
        repeated = []
        for _ in range(REPEATS):  # one at a time, each given its server back if it cost it
            reply = await call(failing, worker, "fail_with", {"code": code})
            repeated.append(error_of(reply))
            if reply["error"]["code"] == "unavailable":
                await states.until("ready")
        restarts = starts(tmp_path) - 1
        measured(
            f"MCP {code}: server restarts for {REPEATS + 1} such answers "
            f"(one with calls in flight, then {REPEATS} in a row): {restarts}"
        )

        assert error_of(failed) == ("tool_error", code), failed
        assert failed["error"]["details"]["server"] == "coded"
        assert [error_of(reply) for reply in others] == [("ok", None)] * IN_FLIGHT
        assert repeated == [("tool_error", code)] * REPEATS
        assert restarts == 0 and worker.mcp.servers["coded"].connects == 1
        assert worker.mcp.states() == {"coded": "ready"}


async def test_a_stdio_server_killed_mid_call_is_still_a_lost_connection(
    broker: Broker, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"coded": misbehaving(tmp_path)})
    async with (
        Caller(broker.url) as caller,
        Caller(broker.url) as other,
        running_worker(settings) as worker,
    ):
        states = ServerStates(caller, worker, "coded")
        await states.until("ready")
        held = holding(other, worker, "k")
        assert (await call(caller, worker, "held", {"count": IN_FLIGHT, "gate": "k"}))["ok"]
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        async with asyncio.timeout(30):
            replies = await asyncio.gather(*held)
        assert [error_of(reply) for reply in replies] == [("unavailable", None)] * IN_FLIGHT
        assert all(reply["error"]["details"]["server"] == "coded" for reply in replies)
        await states.until("degraded")
        await states.until("ready")
        assert (await call(caller, worker, "work", {"value": "again"}))["ok"]
        assert starts(tmp_path) == 2 and worker.mcp.servers["coded"].connects == 2


@asynccontextmanager
async def http_server(state: Path, port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    """The misbehaving server on streamable HTTP, started and ready; killed on exit."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVER),
        env={**os.environ, "TB_STATE_DIR": str(state), "TB_HTTP_PORT": str(port)},
        stdout=asyncio.subprocess.DEVNULL,  # its access log
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        await wait_for_line(process.stderr, b"Uvicorn running", "the HTTP test server")
        yield process
    finally:
        await stop_process(process)


async def test_over_http_an_error_answer_is_tool_error_and_a_dead_server_is_not(
    broker: Broker, tmp_path: Path
) -> None:
    """Over HTTP the SDK's transport also reports a lost response stream as -32000, while
    the session itself is still open: a ping tells the two apart."""
    port = free_port()
    async with http_server(tmp_path, port) as server:
        settings = make_settings(
            broker,
            mcpServers={"web": {"url": f"http://127.0.0.1:{port}/mcp", "connect_timeout_s": 5}},
        )
        async with (
            Caller(broker.url) as failing,
            Caller(broker.url) as other,
            running_worker(settings) as worker,
        ):
            states = ServerStates(failing, worker, "web")
            await states.until("ready")
            for code in CODES:
                failed, others = await one_answer_and_the_others(
                    failing, other, worker, code, f"g{code}"
                )
                assert error_of(failed) == ("tool_error", code), failed
                assert [error_of(reply) for reply in others] == [("ok", None)] * IN_FLIGHT
            assert worker.mcp.servers["web"].connects == 1
            assert worker.mcp.states() == {"web": "ready"}

            # Killed with calls in flight: their response streams end, and the ping
            # that asks whether the server is still there finds it gone.
            held = holding(other, worker, "k")
            assert (await call(failing, worker, "held", {"count": IN_FLIGHT, "gate": "k"}))["ok"]
            await stop_process(server)
            async with asyncio.timeout(30):
                replies = await asyncio.gather(*held)
            assert [error_of(reply) for reply in replies] == [("unavailable", None)] * IN_FLIGHT
            await states.until("degraded")


class _Answers:
    """A session whose server answers pings: alive, as far as the transport can tell."""

    protocol_version = "2025-11-25"  # a handshake-era session: `era.probe` pings it

    async def send_ping(self) -> None:
        return None


async def test_a_response_stream_the_sdk_gave_up_on_is_unknown_not_tool_error() -> None:
    """Over HTTP the mcp SDK answers a request whose response stream it lost with its own
    -32000 ("SSE stream ended without a response"), the session alive. The call may have
    run: `unavailable` (`response_lost`), the session kept; not `tool_error`, which says it
    ran and failed (the review of issue 29). A server's own -32000 stays `tool_error`."""
    current = Session(cast(Any, _Answers()), [], AsyncExitStack(), ping_to_tell_s=1.0)
    lost = await failure(current, MCPError(-32000, "SSE stream ended without a response"), "s")
    own = await failure(current, MCPError(-32000, "the lamp is busy"), "s")
    assert (lost.code.value, lost.details.get("response_lost")) == ("unavailable", True)
    assert (own.code.value, own.details.get("mcp_code")) == ("tool_error", -32000)
    assert not current.ended.is_set()
