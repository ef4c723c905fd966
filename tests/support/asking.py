"""What the tests of input relayed share: the tests' own asking server, a worker that
relays the questions of servers of both generations, the answers a caller gives, and a
continuation's body."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.support.harness import Broker, make_settings, running_worker
from toolbus.worker.service import Worker

ASKING = Path(__file__).parent / "servers" / "asking_server.py"
ELICITED = {"name": "Ada", "check": True, "email": "ada@example.com"}
SAMPLED = {
    "role": "assistant",
    "content": {"type": "text", "text": "a short summary"},
    "model": "caller-model",
    "stopReason": "endTurn",
}


@asynccontextmanager
async def asking_worker(
    broker: Broker, everything: dict[str, Any], runs: Path, **overrides: Any
) -> AsyncIterator[Worker]:
    """A worker on `broker` running server-everything (`everything`: the acceptance
    fixture's entry) and the asking server twice: `modern` (2026-07-28, questions in
    `input_required` results) and `legacy` (pinned to the handshake era, asking mid-call),
    which note each tool body's run in `runs`. `overrides`: more settings."""
    env = {"ASKING_RUNS": str(runs)}
    servers = {
        "everything": everything,
        "modern": {"command": sys.executable, "args": [str(ASKING)], "env": env},
        "legacy": {"command": sys.executable, "args": [str(ASKING), "--legacy"], "env": env},
    }
    async with running_worker(make_settings(broker, mcpServers=servers, **overrides)) as worker:
        yield worker


def continuation(token: str, answers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A continuation's body: `token`'s questions answered (`answers`: key -> the MCP
    result), beside any other envelope `fields` (`id`, `input`)."""
    return {**fields, "continuation": token, "input_responses": answers}
