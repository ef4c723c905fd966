"""An MCP test server whose tools say what they do to a file, over stdio.

`wipe` says it is destructive (`destructiveHint: true`), `peek` that it only reads
(`readOnlyHint: true`), `plain` says nothing (no annotations). Each call appends
`{tool} {target}` to the file $TB_APPROVAL_LOG names, so a test reads from the server
process itself which calls reached it: a gated call must not, until it is approved.
"""

from __future__ import annotations

import logging
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("toolbus-test-approvals")


def _record(tool: str, target: str) -> str:
    with open(os.environ["TB_APPROVAL_LOG"], "a") as log:
        log.write(f"{tool} {target}\n")
    return f"{tool}: {target}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False))
async def wipe(target: str) -> str:
    """Deletes everything under `target` (says so: destructiveHint)."""
    return _record("wipe", target)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def peek(target: str) -> str:
    """Reads `target` (says so: readOnlyHint)."""
    return _record("peek", target)


@server.tool()
async def plain(target: str) -> str:
    """Does something to `target`, without a word about what."""
    return _record("plain", target)


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server.run("stdio")
