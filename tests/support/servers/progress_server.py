"""An MCP test server (the SDK's MCPServer, over stdio) that reports progress.

`count` reports `steps` updates through `ctx.report_progress` (a no-op when the request
carried no `progressToken`) and answers whether the request carried one, so a test sees
both what toolbus relayed and what it asked for. `stutter` reports values that go down
and repeat: MCP says progress MUST increase, so toolbus drops those.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("toolbus-test-progress")


@server.tool()
async def count(steps: int, ctx: Context) -> dict[str, Any]:
    """Reports progress 1..steps of steps, then says whether a progress token came."""
    params: Any = ctx.request_context.params or {}
    meta: dict[str, Any] = dict(params.get("_meta") or {})
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
    return {"token": "progressToken" in meta, "steps": steps}


@server.tool()
async def stutter(ctx: Context) -> str:
    """Reports 1, 3, 2, 3, 4 of 4: only 1, 3 and 4 increase."""
    for value in (1, 3, 2, 3, 4):
        await ctx.report_progress(value, 4)
    return "done"


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server.run("stdio")
