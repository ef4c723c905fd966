"""What a worker loads before its first call: a worker with no MCP server never imports
the mcp SDK (about a second of its start, `bench/cold_start.py`); one with a server does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.config import Settings
from toolbus.worker.wiring import build_worker
servers = json.loads(sys.argv[1])
build_worker(Settings(broker_url="mqtt://127.0.0.1:1", mcpServers=servers), BUILTIN_TOOLS)
print(json.dumps("mcp" in sys.modules))
"""


@pytest.mark.parametrize(
    ("servers", "imported"),
    [
        ({}, False),
        ({"off": {"command": "true", "disabled": True}}, False),
        ({"demo": {"command": sys.executable, "args": ["-m", "toolbus", "demo-server"]}}, True),
    ],
    ids=["none", "disabled", "one"],
)
def test_the_mcp_sdk_is_imported_only_for_a_worker_with_mcp_servers(
    servers: dict[str, object], imported: bool
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(servers)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) is imported
