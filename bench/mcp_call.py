"""An MCP call without the broker: toolbus's executor against the raw SDK session.

Run: `.venv/bin/python bench/mcp_call.py [--calls N] [--rounds N]`. In one process,
one demo MCP server each (`python -m toolbus demo-server`, stdio): first the mcp SDK's
own `stdio_client` and `ClientSession` calling `control_zwave_device` with the schema's
keys (the `raw-mcp` baseline of `toolbus bench`), then toolbus's `Executor.execute` on
an `McpBackend` (our stdio transport, the same SDK session, normalization from the
seed's snake_case keys, the result converted), each `--calls` sequential calls, in
`--rounds` alternating rounds. Printed: the client side's CPU µs a call
(`time.process_time`: this process only, never the server's), the p50 of a call's wall
time, and their ratio: what toolbus's MCP path costs beyond the SDK's, without the
MQTT round trip `toolbus bench`'s `toolbus-mcp` adds to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from toolbus.backends.mcp import McpBackend
from toolbus.calls.call import Call
from toolbus.config import Settings
from toolbus.worker.wiring import build_executor, build_registry

TOOL = "control_zwave_device"
RAW_ARGUMENTS = {"deviceName": "Switch One", "action": "on"}
SEED_ARGUMENTS = {"device_name": "Switch One", "action": "on"}  # normalized by toolbus
SERVER = {"command": sys.executable, "args": ["-m", "toolbus", "demo-server"]}
START_BOUND_S = 60.0


async def timed(call: Callable[[], Awaitable[Any]], calls: int) -> tuple[float, float]:
    """CPU µs a call (this process), and the p50 of the calls' wall time in ms."""
    took: list[float] = []
    cpu = time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        took.append(time.perf_counter() - started)
    return (time.process_time() - cpu) / calls * 1e6, statistics.median(took) * 1000


async def measure(calls: int, rounds: int, errlog: Any) -> dict[str, list[tuple[float, float]]]:
    """`errlog`: the raw session's server's stderr (unread)."""
    figures: dict[str, list[tuple[float, float]]] = {"raw SDK session": [], "toolbus executor": []}
    settings = Settings.model_validate({"topic_prefix": "b", "mcpServers": {"demo": SERVER}})
    registry = build_registry([], settings)
    params = StdioServerParameters(command=SERVER["command"], args=SERVER["args"])
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
        McpBackend(settings.mcp_servers, registry, settings.tools, settings.mcp) as backend,
    ):
        async with asyncio.timeout(START_BOUND_S):
            await session.initialize()
            await backend.wait_settled()
        executor = build_executor(settings, registry, startup=backend)

        async def raw() -> None:
            result = await session.call_tool(TOOL, RAW_ARGUMENTS)
            assert not result.is_error

        async def ours() -> None:
            call = Call(id="b", tool=TOOL, arguments=dict(SEED_ARGUMENTS), topic="b/call")
            outcome = await executor.execute(call)
            assert outcome.ok, outcome.error

        for each in (raw, ours):  # warm both (the SDK lists the tool's schema once)
            await timed(each, 20)
        for _ in range(rounds):
            figures["raw SDK session"].append(await timed(raw, calls))
            figures["toolbus executor"].append(await timed(ours, calls))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with open(os.devnull, "w") as errlog:
        figures = asyncio.run(measure(args.calls, args.rounds, errlog))
    medians = {
        name: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
        for name, runs in figures.items()
    }
    for name, (cpu, wall) in medians.items():
        print(f"{name:18} CPU {cpu:7.1f} µs a call   p50 {wall:6.3f} ms")
    (raw_cpu, raw_wall), (our_cpu, our_wall) = medians.values()
    print(f"toolbus / raw      CPU {our_cpu / raw_cpu:.2f}x   p50 {our_wall - raw_wall:+.3f} ms")


if __name__ == "__main__":
    main()
