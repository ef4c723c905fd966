"""A second MCP test server whose schemas use snake_case, over stdio.

It also exposes `list_devices`, which the demo server has too (a bare-name collision),
and a tool whose announced name breaks the allowed characters (sanitized by toolbus).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer

server = MCPServer("toolbus-test-snake")


@server.tool()
def create_ticket(
    ticket_title: str,
    assignee_name: str,
    priority: Literal["low", "normal", "high"] = "normal",
    tag_list: list[str] | None = None,
) -> dict[str, Any]:
    """Open a ticket; echoes what it received."""
    received: dict[str, Any] = {
        "ticket_title": ticket_title,
        "assignee_name": assignee_name,
        "priority": priority,
    }
    if tag_list is not None:
        received["tag_list"] = tag_list
    return {"received": received}


@server.tool()
def list_devices() -> dict[str, Any]:
    """Same name as the demo server's tool, different answer."""
    return {"server": "snake", "devices": []}


@server.tool(name="weather report!")
def weather_report(city_name: str) -> str:
    """A tool announced under a name outside the allowed characters."""
    return f"sunny in {city_name}"


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server.run("stdio")
