"""Seed 001, the tool-execution spec: MCP connection retry with exponential backoff, and
what the log says when it succeeds late or fails for good (in the seed's words).

Real MCP server processes (the demo server, behind a command that fails its first
starts as a server whose broker is unreachable would), a real broker and worker. The seed's delays are 0, 2 and 4 s: the late
success waits the real 2 s; the runs that fail use a shorter base delay, and the default
schedule is read from the same retry policy the worker uses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from tenacity import RetryCallState

from tests.acceptance.parts import call, fails_first
from tests.support.harness import DEMO_SERVER, Broker, make_settings, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from toolbus.backends.mcp.retry import connect_attempts
from toolbus.config import McpPolicy
from toolbus.worker.service import Worker

BASE_DELAY_S = 0.2  # the failing runs' base delay: attempts after 0, 0.2 and 0.4 s


@dataclass
class Exhausted:
    """A worker whose only MCP server fails every start, and what was logged meanwhile."""

    worker: Worker
    lines: list[logging.LogRecord]

    def failed_attempts(self) -> list[logging.LogRecord]:
        return [r for r in self.lines if r.getMessage().startswith("MCP connection attempt")]

    def final(self) -> logging.LogRecord:
        [line] = [r for r in self.lines if r.levelno == logging.ERROR]
        return line


@pytest_asyncio.fixture(scope="module")
async def exhausted(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Exhausted]:
    state = tmp_path_factory.mktemp("zwave")
    settings = make_settings(
        broker,
        mcpServers={"zwave": fails_first(state, 99)},
        mcp={"startup_base_delay_s": BASE_DELAY_S, "recovery_max_delay_s": 5},
    )
    with watching("toolbus.mcp", "MCP connection failed after", logging.INFO) as logged:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"zwave": "down"}
            assert logged.seen.is_set()
            lines = of_server(logged.records, "zwave")
            # Up to the final error: the background retries that follow number afresh.
            end = next(i for i, r in enumerate(lines) if r.levelno == logging.ERROR)
            yield Exhausted(worker, lines[: end + 1])


async def test_a_server_that_starts_connects_at_once(broker: Broker) -> None:
    """Seed 001_a4be83c33a199967.txt: "Successful connection on first attempt".

    No failed attempt, no delay, no "succeeded on attempt" line (that one follows
    failures only); the tools are registered.
    """
    settings = make_settings(broker, mcpServers={"steady": DEMO_SERVER})
    with watching("toolbus.mcp", "MCP connection", logging.INFO) as logged:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"steady": "ready"}
            assert worker.mcp.servers["steady"].connects == 1
            assert "control_zwave_device" in worker.registry
    assert [r.getMessage() for r in of_server(logged.records, "steady")] == []


async def test_a_server_that_fails_once_connects_on_attempt_2(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    """Seed 001_a4be83c33a199967.txt: "Successful connection after retry".

    The first attempt fails, the second comes 2 s later (the default base delay) and
    succeeds; the log says "MCP connection succeeded on attempt 2" and the tools work.
    """
    settings = make_settings(
        broker,
        mcpServers={"flaky": fails_first(tmp_path, 1)},
        mcp={"startup_base_delay_s": McpPolicy().startup_base_delay_s},
    )
    with watching("toolbus.mcp", "MCP connection succeeded", logging.INFO) as logged:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"flaky": "ready"}
            switched = {"deviceName": "Switch One", "action": "on"}
            assert (await call(caller, worker, "control_zwave_device", switched))["ok"]
    lines = of_server(logged.records, "flaky")
    [failed] = [r for r in lines if r.getMessage().startswith("MCP connection attempt")]
    assert vars(failed)["retry_in_s"] == 2.0
    assert "MCP connection attempt 1 failed (server flaky)" in failed.getMessage()
    assert "retrying in 2.0 s" in failed.getMessage()
    [succeeded] = [r for r in lines if "succeeded" in r.getMessage()]
    assert "MCP connection succeeded on attempt 2" in succeeded.getMessage()
    assert (vars(succeeded)["server"], vars(succeeded)["attempt"]) == ("flaky", 2)
    assert (tmp_path / "starts").read_text().strip() == "2"


async def test_after_three_failed_attempts_the_worker_goes_on_without_the_server(
    caller: Caller, exhausted: Exhausted
) -> None:
    """Seed 001_a4be83c33a199967.txt: "Connection fails after all retries".

    Three attempts, all failed; the error line says "MCP connection failed after 3
    attempts" with the server's stderr; the local tools still answer.
    """
    final = exhausted.final()
    assert "MCP connection failed after 3 attempts (server zwave)" in final.getMessage()
    assert "start 3: cannot reach the MQTT broker" in final.getMessage()
    assert vars(final)["attempts"] == 3
    assert [vars(r)["attempt"] for r in exhausted.failed_attempts()] == [1, 2]
    assert (await call(caller, exhausted.worker, "echo", {"text": "local"}))["ok"]


def test_the_delays_double_from_2_s(exhausted: Exhausted) -> None:
    """Seed 001_a4be83c33a199967.txt: "Exponential backoff delays".

    Each retry is logged with its attempt number and delay. With the default policy the
    attempts come after 0, 2 and 4 s (6 s in all): read from the retry policy the worker
    runs; the run here, with a base of 0.2 s, shows the same doubling for real.
    """
    attempts = [(vars(r)["attempt"], vars(r)["retry_in_s"]) for r in exhausted.failed_attempts()]
    assert attempts == [(1, BASE_DELAY_S), (2, 2 * BASE_DELAY_S)]
    texts = [r.getMessage() for r in exhausted.failed_attempts()]
    assert "retrying in 0.2 s" in texts[0] and "retrying in 0.4 s" in texts[1]
    assert default_delays() == [2.0, 4.0]
    assert sum(default_delays()) == 6.0


def test_the_servers_stderr_is_in_the_error(exhausted: Exhausted) -> None:
    """Seed 001_a4be83c33a199967.txt: "MCP server stderr captured in errors".

    The error line's text has the server's stderr (its last lines), kept apart from the
    protocol on stdout: no stderr line was taken for JSON-RPC.
    """
    final = exhausted.final()
    assert (
        "MCP server stderr: zwave-mcp-server: start 1: cannot reach the MQTT broker | "
        "zwave-mcp-server: start 2: cannot reach the MQTT broker | "
        "zwave-mcp-server: start 3: cannot reach the MQTT broker."
    ) in final.getMessage()
    assert (
        vars(final)["stderr_tail"][-1] == "zwave-mcp-server: start 3: cannot reach the MQTT broker"
    )
    assert exhausted.worker.mcp.servers["zwave"].bad_stdout_lines == 0


def test_the_error_says_degraded_mode_and_what_to_check(exhausted: Exhausted) -> None:
    """Seed 001_a4be83c33a199967.txt: "Clear user-facing error messages".

    The line says the worker continues in "degraded mode (local tools only)", names the
    tools it keeps, and suggests checking the MQTT broker and MCP server configuration.
    """
    text = exhausted.final().getMessage()
    assert "degraded mode (local tools only)" in text
    assert "check the MQTT broker and MCP server configuration (mcpServers.zwave)" in text
    assert "datetime, echo" in text
    assert vars(exhausted.final())["hint"].startswith("check the MQTT broker")


async def test_the_worker_serves_while_a_server_is_retried(
    broker: Broker, caller: Caller, tmp_path: Path
) -> None:
    """Seed 001_a4be83c33a199967.txt: "Retry doesn't block startup".

    While the server's second attempt is pending, the worker already answers calls for
    its other tools; only a call for that server's tool waits (within its deadline).
    """
    settings = make_settings(
        broker,
        mcpServers={"waiting": fails_first(tmp_path, 1)},
        mcp={"startup_base_delay_s": McpPolicy().startup_base_delay_s},  # the seed's 2 s
    )
    first = "MCP connection attempt 1 failed (server waiting)"
    with watching("toolbus.mcp", first, logging.WARNING) as retrying:
        async with running_worker(settings, wait_mcp=False) as worker:
            async with asyncio.timeout(30):
                await retrying.seen.wait()
            assert worker.mcp.states() == {"waiting": "connecting"}
            assert (await call(caller, worker, "echo", {"text": "now"}))["ok"]
            assert worker.mcp.states() == {"waiting": "connecting"}
            later = {"deviceName": "Switch Two", "action": "on"}
            waited = await call(caller, worker, "control_zwave_device", later, timeout_s=30)
            assert waited["ok"], waited


async def test_attempts_and_delay_are_one_setting_each(broker: Broker, tmp_path: Path) -> None:
    """Seed 001_a4be83c33a199967.txt: "Retry logic is configurable".

    `[mcp] startup_attempts` (3) and `startup_base_delay_s` (2 s) are the one place; two
    attempts configured are two attempts made, and the words follow.
    """
    assert (McpPolicy().startup_attempts, McpPolicy().startup_base_delay_s) == (3, 2.0)
    settings = make_settings(
        broker,
        mcpServers={"configured": fails_first(tmp_path, 99)},
        mcp={"startup_attempts": 2, "startup_base_delay_s": 0.1, "recovery_max_delay_s": 5},
    )
    with watching("toolbus.mcp", "MCP connection failed after", logging.INFO) as logged:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"configured": "down"}
    lines = of_server(logged.records, "configured")
    [final] = [r for r in lines if r.levelno == logging.ERROR]  # once: not again at the stop
    assert "MCP connection failed after 2 attempts (server configured)" in final.getMessage()
    assert next(vars(r)["retry_in_s"] for r in lines if "retry_in_s" in vars(r)) == 0.1


def of_server(records: list[logging.LogRecord], server: str) -> list[logging.LogRecord]:
    """The worker's own MCP lines about `server` (not its stderr, not other tests' servers),
    about its connection: not the line saying which protocol version a session speaks."""
    return [
        r
        for r in records
        if r.name == "toolbus.mcp"
        and vars(r).get("server") == server
        and "protocol_version" not in vars(r)
    ]


def default_delays() -> list[float]:
    """The waits between the default policy's start-up attempts, as tenacity computes them."""
    retrying = connect_attempts(
        McpPolicy(), startup=True, stopping=asyncio.Event(), before_sleep=lambda _: None
    )
    delays = []
    for number in range(1, McpPolicy().startup_attempts):
        state = RetryCallState(retrying, fn=None, args=(), kwargs={})
        state.attempt_number = number
        delays.append(retrying.wait(state))
    return delays
