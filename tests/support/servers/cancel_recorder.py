"""An MCP test server that records what its calls lived through, over stdio.

`hold` writes `started {marker}` to the file named by $TB_CANCEL_LOG, then waits
forever; when the client's `notifications/cancelled` interrupts it (the SDK's default
`peer_cancel_mode`), it writes `cancelled {marker}`. So a test reads, from a real MCP
server process, that a toolbus cancel reached it as MCP's own cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("toolbus-test-cancel-recorder")


def _write(line: str) -> None:
    with open(os.environ["TB_CANCEL_LOG"], "a") as log:
        log.write(line + "\n")


@server.tool()
async def hold(marker: str) -> str:
    """Waits until cancelled; says so in the log."""
    _write(f"started {marker}")
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        _write(f"cancelled {marker}")
        raise
    return marker


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server.run("stdio")
