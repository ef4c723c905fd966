"""The guards' MCP server (the mcp SDK's MCPServer, over stdio): progress and a call to cancel.

The guard worker runs it beside the demo server, by its path (`python -P`, as the load
generator runs: it needs the SDK, not `toolbus`), so that progress and cancel are
guarded on the MCP path too: `notifications/progress` relayed to the caller, and a
caller's cancel reaching the server as `notifications/cancelled`.

- `bench_guard_mcp_steps(n)`: reports progress 1..n (`ctx.report_progress`), then answers.
- `bench_guard_mcp_hold(hold_s, key)`: reports progress 1 once running, then waits;
  cancelled, it writes `stopped {key}` to the file its command line names.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from mcp.server.mcpserver import Context, MCPServer

STEPS_TOOL = "bench_guard_mcp_steps"  # guard_tools.MCP_STEPS_TOOL (not imported: run alone)
HOLD_TOOL = "bench_guard_mcp_hold"

server = MCPServer("toolbus-bench-guards")


@server.tool(name=STEPS_TOOL)
async def steps(n: int, ctx: Context) -> dict[str, int]:
    """Reports progress 1..n, then answers n."""
    for step in range(1, n + 1):
        await ctx.report_progress(step, n, "step")
    return {"steps": n}


@server.tool(name=HOLD_TOOL)
async def hold(hold_s: float, ctx: Context, key: str = "") -> dict[str, float]:
    """Reports that it runs, then holds for `hold_s` (a caller cancels it before); a
    `notifications/cancelled` that reaches it writes `stopped {key}` to the file named
    on the command line (guard_tools.stopped)."""
    await ctx.report_progress(1, None, "running")
    try:
        await asyncio.sleep(hold_s)
    except asyncio.CancelledError:
        with open(sys.argv[1], "a") as f:  # noqa: ASYNC230 -- one line, then gone
            f.write(f"stopped {key}\n")
        raise
    return {"held_s": hold_s}


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server.run("stdio")
