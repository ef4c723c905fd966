"""What the tests of input relayed share: the tests' own asking server, the servers a
worker that relays questions runs, and the answers a caller gives."""

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
