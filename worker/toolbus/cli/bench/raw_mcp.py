"""The raw-SDK baseline: one stdio `ClientSession` calling one tool, N calls in flight.

    python -m toolbus.bench.raw_mcp --tool control_zwave_device \
        --arguments '{"deviceName": "Switch One", "action": "on"}' --in-flight 16

What a program that talks to the MCP server directly pays, with no broker in the
path: the mcp SDK's own `stdio_client` starts the demo server (`python -m toolbus
demo-server`, its stderr to /dev/null), one session is initialized, and N tasks each
call the tool again as soon as their last call returns. It is its own load generator,
with the load generator's protocol: `window open` after `--warmup-s`, `window closed`
after `--duration-s`, then the same JSON line (`loadgen.LoadFigures`). A result with
`isError` or a call that raises counts as a failure.
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
    WINDOW_CLOSED,
    WINDOW_OPEN,
    LoadFigures,
    figures,
    say,
)

INITIALIZE_BOUND_S = 30.0


class Loop:
    """N callers on one session; the window as the load generator keeps it."""

    def __init__(self, session: ClientSession, tool: str, arguments: dict[str, Any]) -> None:
        self.session, self.tool, self.arguments = session, tool, arguments
        self.measuring = False
        self.sending = True
        self.latencies_s: list[float] = []
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

    async def run(self, in_flight: int, warmup_s: float, duration_s: float) -> LoadFigures:
        callers = [asyncio.create_task(self.caller(), name=f"caller-{n}") for n in range(in_flight)]
        await asyncio.sleep(warmup_s)
        self.measuring = True
        opened = time.perf_counter()
        say(WINDOW_OPEN)
        await asyncio.sleep(duration_s)
        self.measuring = False
        closed = time.perf_counter()
        counted = len(self.latencies_s)
        say(WINDOW_CLOSED)
        self.sending = False
        _, late = await asyncio.wait(callers, timeout=DRAIN_BOUND_S)
        for task in late:
            task.cancel()
        return figures(self.latencies_s[:counted], closed - opened, self.failures + len(late))


async def measure(
    tool: str,
    arguments: dict[str, Any],
    loop: tuple[int, float, float],
    errlog: TextIO,
) -> LoadFigures:
    """`loop`: in flight, warm-up and measured seconds; `errlog`: the server's stderr."""
    server = StdioServerParameters(command=sys.executable, args=["-m", "toolbus", "demo-server"])
    async with (
        stdio_client(server, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        async with asyncio.timeout(INITIALIZE_BOUND_S):
            await session.initialize()
        return await Loop(session, tool, arguments).run(*loop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", required=True)
    parser.add_argument("--arguments", required=True, help="the tool's arguments as JSON")
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    loop = (args.in_flight, args.warmup_s, args.duration_s)
    with open(os.devnull, "w") as errlog:  # the server's log lines, unread
        result = asyncio.run(measure(args.tool, json.loads(args.arguments), loop, errlog))
    say(result.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
