"""An MCP test server (the SDK's MCPServer, over stdio) whose tools ask their client.

`pick_device` elicits a choice (form mode), `summarize` samples the client's model,
and `pick_twice` asks twice. The SDK's resolvers ask the way the negotiated protocol
does: on 2026-07-28 the result is `input_required` (`inputRequests` + `requestState`)
and the client calls again with `inputResponses`; on 2025-11-25 and before, the server
sends `elicitation/create` / `sampling/createMessage` on the session mid-call.

`--legacy` serves the handshake era only (`legacy_only`: a client that negotiates falls back to
`initialize`): the same tools, asked the older way. Each call of a tool's body
is counted in the file named by `ASKING_RUNS` (if set), one line per run.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve, Sample
from mcp_types import CreateMessageResult, SamplingMessage, TextContent
from pydantic import BaseModel

# Run as a script: the repository root, so the tests' own helper module imports.
sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.support.servers.legacy_only import serve_legacy_only

server = MCPServer("toolbus-test-asking")


class Choice(BaseModel):
    device: str


def _ran(name: str) -> None:
    path = os.environ.get("ASKING_RUNS")
    if path:
        with open(path, "a", encoding="utf-8") as runs:
            runs.write(name + "\n")


def which_device(room: str) -> Elicit[Choice]:
    return Elicit(f"Which device in {room}?", Choice)


def which_other(room: str) -> Elicit[Choice]:
    return Elicit(f"And which other device in {room}?", Choice)


def summary_of(text: str) -> Sample:
    message = SamplingMessage(
        role="user", content=TextContent(type="text", text=f"Summarize: {text}")
    )
    return Sample([message], max_tokens=50)


@server.tool()
async def pick_device(
    room: str, choice: Annotated[ElicitationResult[Choice], Resolve(which_device)]
) -> dict[str, Any]:
    """Asks which device in the room, and says what it was told."""
    _ran("pick_device")
    data = getattr(choice, "data", None)
    return {"action": choice.action, "device": data.device if data is not None else None}


@server.tool()
async def pick_twice(
    room: str,
    first: Annotated[ElicitationResult[Choice], Resolve(which_device)],
    second: Annotated[ElicitationResult[Choice], Resolve(which_other)],
) -> dict[str, Any]:
    """Asks two questions before it runs."""
    _ran("pick_twice")
    names = [getattr(getattr(r, "data", None), "device", None) for r in (first, second)]
    return {"devices": names}


@server.tool()
async def summarize(
    text: str, sampled: Annotated[CreateMessageResult, Resolve(summary_of)]
) -> dict[str, Any]:
    """Asks the client's model to summarize `text`."""
    _ran("summarize")
    content: Any = sampled.content
    return {"summary": getattr(content, "text", None), "model": sampled.model}


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    if "--legacy" in sys.argv:
        anyio.run(serve_legacy_only, server)
    else:
        server.run("stdio")
