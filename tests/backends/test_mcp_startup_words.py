"""What the log says when an MCP server's start-up fails (issue 30, point 7): real server
commands (one that does not exist, one that exits 3) under a real worker on a real broker,
read from the log records' fields and the seed's words.

Before, the hint blamed the MQTT broker whatever failed, the background retries after
the seed's three attempts started again at "attempt 1", and the stderr in the final line
held each attempt's lines again (three attempts, the same traceback three times).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tests.support.harness import Broker, make_settings, running_worker
from tests.support.logwait import watching

FAST = {"startup_base_delay_s": 0.05, "recovery_max_delay_s": 0.1}
BOUND_S = 30.0


def of_server(records: list[logging.LogRecord], server: str) -> list[logging.LogRecord]:
    return [r for r in records if r.name == "toolbus.mcp" and vars(r).get("server") == server]


async def startup_lines(broker: Broker, name: str, server: dict[str, Any]) -> list[Any]:
    """The worker's own lines about `name`, up to its second background attempt."""
    settings = make_settings(broker, mcpServers={name: server}, mcp=FAST)
    # The fifth failed attempt: the seed's three, then two in the background.
    with watching("toolbus.mcp", f"MCP connection attempt 5 failed (server {name}") as logged:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {name: "down"}
            async with asyncio.timeout(BOUND_S):
                await logged.seen.wait()
    return of_server(logged.records, name)


def final(lines: list[logging.LogRecord]) -> logging.LogRecord:
    [line] = [r for r in lines if r.levelno == logging.ERROR]
    return line


def failed_attempts(lines: list[logging.LogRecord]) -> list[tuple[int, bool]]:
    return [
        (vars(r)["attempt"], vars(r).get("background", False))
        for r in lines
        if r.getMessage().startswith("MCP connection attempt")
    ]


async def test_a_command_that_does_not_exist_is_named_not_found_on_path(broker: Broker) -> None:
    lines = await startup_lines(broker, "ghost", {"command": "no-such-mcp-server-30"})
    last = final(lines)
    hint = vars(last)["hint"]
    assert "'no-such-mcp-server-30' was not found on PATH (" in hint
    assert "mcpServers.ghost.command" in hint
    assert "broker" not in hint  # nothing was started that could need one
    # The seed's words stay: the count, degraded mode, the stderr (none here).
    assert "MCP connection failed after 3 attempts (server ghost)" in last.getMessage()
    assert "degraded mode (local tools only)" in last.getMessage()
    assert "MCP server stderr: (empty)" in last.getMessage()


async def test_background_retries_number_on_from_the_seeds_three(broker: Broker) -> None:
    lines = await startup_lines(broker, "ghost", {"command": "no-such-mcp-server-30"})
    attempts = failed_attempts(lines)
    assert attempts[:4] == [(1, False), (2, False), (4, True), (5, True)]
    assert vars(final(lines))["attempts"] == 3
    texts = [r.getMessage() for r in lines if r.getMessage().startswith("MCP connection attempt")]
    assert texts[2].startswith("MCP connection attempt 4 failed (server ghost, in the background)")


async def test_a_server_that_exits_3_is_told_with_its_code_and_its_stderr_once(
    broker: Broker,
) -> None:
    script = "echo 'exiter: config missing' >&2; echo 'exiter: giving up' >&2; exit 3"
    lines = await startup_lines(broker, "exiter", {"command": "sh", "args": ["-c", script]})
    last = final(lines)
    assert "the server process exited with code 3" in vars(last)["hint"]
    assert vars(last)["error"] == "ConnectionError: the server process exited with code 3"
    # Three attempts wrote the same two lines: shown once, and said so.
    assert vars(last)["stderr_tail"] == ["exiter: config missing", "exiter: giving up"]
    assert (
        "MCP server stderr: exiter: config missing | exiter: giving up | "
        "(the same at attempts 1 to 3)."
    ) in last.getMessage()
    # The seed's words for a server that started and gave up stay in its hint.
    assert (
        "check the MQTT broker and MCP server configuration (mcpServers.exiter)"
        in (vars(last)["hint"])
    )


def test_each_attempts_stderr_is_shown_once_even_past_the_tails_bound() -> None:
    """`by_attempt` alone: alike attempts collapse, different ones stay in order, lines of
    an earlier session (before the first attempt) and lines past the bound are left out."""
    from toolbus.backends.mcp.stderr import StderrTail, by_attempt  # loads the mcp SDK

    tail = StderrTail(5)
    tail.append("an earlier session's line")
    marks = []
    for lines in (["a", "b"], ["a", "b"], ["c"], ["d", "e"]):
        marks.append(tail.appended)
        for line in lines:
            tail.append(line)
    # Kept: attempt 2's a and b, c, d, e; the earlier line and attempt 1's, past the bound.
    assert by_attempt(tail, marks) == (["a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e"])
    alike = StderrTail(50)
    marks = []
    for _ in range(3):
        marks.append(alike.appended)
        alike.append("Traceback")
        alike.append("ModuleNotFoundError: x")
    lines, shown = by_attempt(alike, marks)
    assert lines == ["Traceback", "ModuleNotFoundError: x"]
    assert shown == [*lines, "(the same at attempts 1 to 3)"]
