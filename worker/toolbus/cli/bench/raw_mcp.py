"""The raw-SDK baseline: one stdio `ClientSession` calling one tool, N calls in flight.

    python -m toolbus.bench.raw_mcp --tool control_zwave_device \
        --arguments '{"deviceName": "Switch One", "action": "on"}' --in-flight 16

What a program that talks to the MCP server directly pays, with no broker in the
path: the mcp SDK's own `stdio_client` starts the demo server (`python -m toolbus
demo-server`, its stderr to /dev/null), one session is initialized, and N tasks each
call the tool again as soon as their last call returns. It is its own load generator,
with the load generator's protocol: `started`, `window open` after `--warmup-s`,
`window closed` after `--duration-s` (or each at a line on stdin, `--window-on-stdin`),
then the same JSON line (`loadgen.LoadFigures`, with `--samples` the latencies too). A
result with `isError` or a call that raises counts as a failure. `toolbus bench` always
runs one: the baseline is one session, whatever `--loadgens` says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, TextIO

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from toolbus.cli.bench.loadgen import (
    DRAIN_BOUND_S,
    STARTED,
    WINDOW_CLOSED,
    WINDOW_OPEN,
    LoadFigures,
    figures,
    result_line,
    say,
    wait_for_line,
)

INITIALIZE_BOUND_S = 30.0


class Loop:
    """N callers on one session; the window as the load generator keeps it."""

    def __init__(self, session: ClientSession, tool: str, arguments: dict[str, Any]) -> None:
        self.session, self.tool, self.arguments = session, tool, arguments
        self.measuring = False
        self.sending = True
        self.latencies_s: list[float] = []
        self.counted = 0
        self.failures = 0

    async def caller(self) -> None:
        while self.sending:
            started = time.perf_counter()
            try:
                result = await self.session.call_tool(self.tool, self.arguments)
            except Exception:
                self.failures += 1
                continue
            took = time.perf_counter() - started
            if result.is_error:
                self.failures += 1
            elif self.measuring:
                self.latencies_s.append(took)

    async def run(
        self, in_flight: int, warmup_s: float, duration_s: float, on_stdin: bool = False
    ) -> LoadFigures:
        callers = [asyncio.create_task(self.caller(), name=f"caller-{n}") for n in range(in_flight)]
        say(STARTED)
        await (asyncio.to_thread(wait_for_line) if on_stdin else asyncio.sleep(warmup_s))
        self.measuring = True
        opened = time.perf_counter()
        say(WINDOW_OPEN)
        await (asyncio.to_thread(wait_for_line) if on_stdin else asyncio.sleep(duration_s))
        self.measuring = False
        closed = time.perf_counter()
        self.counted = len(self.latencies_s)
        say(WINDOW_CLOSED)
        self.sending = False
        _, late = await asyncio.wait(callers, timeout=DRAIN_BOUND_S)
        for task in late:
            task.cancel()
        return figures(self.measured, closed - opened, self.failures + len(late))

    @property
    def measured(self) -> list[float]:
        """The latencies inside the window, in seconds."""
        return self.latencies_s[: self.counted]


async def measure(
    tool: str,
    arguments: dict[str, Any],
    loop: tuple[int, float, float, bool],
    errlog: TextIO,
) -> tuple[LoadFigures, list[float]]:
    """`loop`: in flight, warm-up and measured seconds, the window on stdin; `errlog`:
    the server's stderr. The figures, and the latencies they were made of."""
    server = StdioServerParameters(command=sys.executable, args=["-m", "toolbus", "demo-server"])
    async with (
        stdio_client(server, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        async with asyncio.timeout(INITIALIZE_BOUND_S):
            await session.initialize()
        calls = Loop(session, tool, arguments)
        return await calls.run(*loop), calls.measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", required=True)
    parser.add_argument("--arguments", required=True, help="the tool's arguments as JSON")
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--window-on-stdin", action="store_true")
    parser.add_argument("--samples", action="store_true", help="add latencies_ms to the JSON")
    args = parser.parse_args(argv)
    loop = (args.in_flight, args.warmup_s, args.duration_s, args.window_on_stdin)
    with open(os.devnull, "w") as errlog:  # the server's log lines, unread
        result, latencies = asyncio.run(
            measure(args.tool, json.loads(args.arguments), loop, errlog)
        )
    say(result_line(result, latencies if args.samples else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
