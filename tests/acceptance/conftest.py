"""Fixtures of the acceptance tests: a third-party MCP server, installed on first use."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.acceptance.seeds import ROOT

INSTALL_BOUND_S = 600  # a first install fetches ~100 npm packages; later runs find the stamp
EVERYTHING = ROOT / ".tools" / "mcp-everything" / "node_modules" / "@modelcontextprotocol"


@pytest.fixture(scope="session")
def everything_server() -> dict[str, Any]:
    """`mcpServers` entry for the MCP project's reference server-everything (TypeScript
    SDK, over stdio), pinned by tools/mcp-everything and installed by
    scripts/ensure-mcp-everything (`make test` has run it; here it is a no-op then)."""
    installed = subprocess.run(
        [str(ROOT / "scripts" / "ensure-mcp-everything")],
        capture_output=True,
        text=True,
        timeout=INSTALL_BOUND_S,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    script = EVERYTHING / "server-everything" / "dist" / "index.js"
    return {"command": "node", "args": [str(script), "stdio"]}
