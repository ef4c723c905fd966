"""An MCP server whose listing says its tools run only as tasks, but which answers a task's
`tools/call` as it likes (TB_TASK_ANSWER): `plain`, the result at once (a server that
ignores the task it was asked for); `garbage`, neither a task nor a result; `unshaped`,
the result at once without the structured content its tool's outputSchema promises."""

from __future__ import annotations

import os
from typing import Any

from mcp.server.mcpserver import MCPServer

ANSWER = os.environ.get("TB_TASK_ANSWER", "plain")


async def claims_tasks(ctx: Any, call_next: Any) -> Any:
    if ctx.method == "tools/list":
        listed = await call_next(ctx)
        for tool in listed["tools"]:
            tool["execution"] = {"taskSupport": "required"}
        return listed
    if ctx.method == "tools/call" and ANSWER == "garbage":
        return {"neither": "a task nor a result"}
    if ctx.method == "tools/call" and ANSWER == "unshaped":
        answered = dict(await call_next(ctx))
        answered.pop("structuredContent", None)
        return answered
    return await call_next(ctx)


server = MCPServer("task-claimer", middleware=[claims_tasks])


@server.tool()
async def report(topic: str) -> str:
    """Says it is done."""
    return f"report on {topic}"


if __name__ == "__main__":
    server.run("stdio")
