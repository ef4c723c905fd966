"""What the tests of input relayed share: the tests' own asking server, the servers a
worker that relays questions runs, the answers a caller gives, and a continuation's body."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ASKING = Path(__file__).parent / "servers" / "asking_server.py"
ELICITED = {"name": "Ada", "check": True, "email": "ada@example.com"}
SAMPLED = {
    "role": "assistant",
    "content": {"type": "text", "text": "a short summary"},
    "model": "caller-model",
    "stopReason": "endTurn",
}


def asking_servers(everything: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """server-everything, and the asking server twice: `modern` (2026-07-28, questions in
    `input_required` results) and `legacy` (pinned to the handshake era, asking mid-call)."""
    return {
        "everything": everything,
        "modern": {"command": sys.executable, "args": [str(ASKING)], "env": env},
        "legacy": {"command": sys.executable, "args": [str(ASKING), "--legacy"], "env": env},
    }


def continuation(token: str, answers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A continuation's body: `token`'s questions answered (`answers`: key -> the MCP
    result), beside any other envelope `fields` (`id`, `input`)."""
    return {**fields, "continuation": token, "input_responses": answers}
