"""What the acceptance tests share: the seed's own local tools, a misbehaving MCP server,
and calls as a user makes them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.support.mqtt import Caller
from toolbus.backends.local.functions import LocalTool
from toolbus.worker.service import Worker

MISBEHAVING = Path(__file__).parent.parent / "support" / "servers" / "misbehaving.py"

# The seed's built-in tools besides `datetime`: toolbus ships none by these names (its own
# built-ins are `datetime` and `echo`), so they are local tools here, as a deployment would
# install them. Each answers with the arguments it received, exactly.
OPEN_SCHEMA = {"type": "object", "additionalProperties": True}


async def _received(**arguments: Any) -> dict[str, Any]:
    return {"received": arguments}


SEARCH = LocalTool(
    name="search",
    description="Search the web; answers with the arguments it received.",
    input_schema={**OPEN_SCHEMA, "properties": {"query": {"type": "string"}}},
    fn=_received,
)
VOLUME = LocalTool(
    name="volume",
    description="Set the speaker volume; answers with the arguments it received.",
    input_schema={**OPEN_SCHEMA, "properties": {"level": {"type": "integer"}}},
    fn=_received,
)


def misbehaving(state: Path, **env: str) -> dict[str, Any]:
    """`mcpServers` entry for tests/support/servers/misbehaving.py (modes from `env`)."""
    return {
        "command": sys.executable,
        "args": [str(MISBEHAVING)],
        "env": {"TB_STATE_DIR": str(state), **env},
    }


# A server command that fails its first starts at once (as a server whose broker is
# unreachable would), then runs the demo device server: start-ups that fail cost
# milliseconds, not an interpreter's import of the mcp SDK each.
_FAILS_FIRST = (
    'n=$(cat "$0/starts" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$0/starts"; '
    'if [ "$n" -le "$1" ]; then '
    'echo "zwave-mcp-server: start $n: cannot reach the MQTT broker" >&2; exit 2; fi; '
    'exec "$2" -m toolbus demo-server'
)


def fails_first(state: Path, starts: int) -> dict[str, Any]:
    """`mcpServers` entry: the demo server, after `starts` failed starts (counted in `state`)."""
    return {"command": "sh", "args": ["-c", _FAILS_FIRST, str(state), str(starts), sys.executable]}


async def call(
    client: Caller, worker: Worker, tool: str, arguments: dict[str, Any], /, **body: Any
) -> dict[str, Any]:
    """One call over MQTT, as a caller sends it (`body`: more fields, e.g. `caller`); the
    parsed reply."""
    return await client.call_tool(worker.topics, tool, arguments, **body)


def renames(reply: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The reply's report of argument renames: {from: (to, rule)}."""
    return {
        entry["from"]: (entry["to"], entry["rule"])
        for entry in reply["normalized"]
        if entry["path"].startswith("arguments.")
    }
