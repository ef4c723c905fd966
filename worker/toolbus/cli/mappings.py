"""The `toolbus mappings` command line: what normalization accepts, per tool, as Markdown.

It starts the configured MCP servers (no broker needed) to learn their tools, prints
the document (`normalization.mappings`) on stdout, and on stderr which configuration it
read and every server it could not start. It only looks, once: a server whose command
does not exist is `down` at its first attempt (a worker keeps retrying it). Exit codes:
0 printed, 1 the tool asked for is unknown or a server it was asked about is down (what
is known is printed all the same), 2 a usage or configuration error (cli.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from toolbus.wire.untrusted import printable

if TYPE_CHECKING:
    from toolbus.backends.mcp import McpBackend
    from toolbus.backends.mcp.server import McpServer
    from toolbus.config import Settings

EXIT_OK, EXIT_ERROR = 0, 1  # as cli.py's
SETTLE_MARGIN_S = 5.0  # past the longest connect timeout, for start-up's retry delays


def add_arguments(mappings: argparse.ArgumentParser) -> None:
    mappings.description = (
        "Start the configured MCP servers and print, per tool, every accepted spelling and "
        "value transformation as Markdown. Exits 1 when the tool is unknown or a server "
        "it was asked about is down."
    )
    mappings.add_argument("tool", nargs="?", help="one tool (any name that resolves)")
    mappings.add_argument("--config", type=Path, help="config file (TOML or JSON)")
    mappings.add_argument("--mcp-config", type=Path, help="MCP client config file with mcpServers")


def run(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    """`environ`: the entry point's, to tell whether TOOLBUS_* variables had a say."""
    from toolbus.backends.local import BUILTIN_TOOLS  # noqa: PLC0415 -- likewise
    from toolbus.backends.local.functions import load_entry_points  # noqa: PLC0415 -- the MCP SDK on use
    from toolbus.backends.mcp import McpBackend  # noqa: PLC0415 -- likewise
    from toolbus.normalization.mappings import render  # noqa: PLC0415 -- likewise
    from toolbus.observability.logs import setup_logging  # noqa: PLC0415 -- likewise
    from toolbus.wire.errors import UnknownTool  # noqa: PLC0415 -- likewise
    from toolbus.worker.wiring import build_executor, build_registry  # noqa: PLC0415 -- likewise

    # Every line printable: server names, a server's errors and its schemas are theirs.
    print(f"toolbus mappings: {printable(sources(args, settings, environ))}", file=sys.stderr)
    setup_logging("WARNING", settings.log_format)
    registry = build_registry([*BUILTIN_TOOLS, *load_entry_points()], settings)
    executor = build_executor(settings, registry)
    backend = McpBackend(
        settings.mcp_servers,
        registry,
        settings.tools,
        settings.mcp,
        retry_missing_command=False,
        listeners=[_stop_when_down],  # a look, once: no background retries
    )
    down = asyncio.run(_discover(backend, settings))
    for name, why in down.items():
        print(
            f"toolbus mappings: {printable(f'MCP server {name} is down: {why}')}", file=sys.stderr
        )
    try:
        print(render(registry, executor.normalizer, args.tool))  # printable line by line
    except UnknownTool as exc:
        print(f"toolbus: {printable(exc.message)}", file=sys.stderr)
        if down:
            maybe = f"it may be a tool of {', '.join(down)}"
            print(f"toolbus mappings: {printable(maybe)}", file=sys.stderr)
        return EXIT_ERROR
    # A tool that resolved is served; without one, every server was asked about.
    return EXIT_ERROR if down and args.tool is None else EXIT_OK


def _stop_when_down(server: McpServer) -> None:
    if server.state == "down":
        server.stop()


async def _discover(backend: McpBackend, settings: Settings) -> dict[str, str]:
    """Start every server and wait until each is ready or down; why each is not ready."""
    servers = settings.mcp_servers.values()
    budget_s = max((c.connect_timeout_s for c in servers), default=0) + SETTLE_MARGIN_S
    async with backend:
        try:
            async with asyncio.timeout(budget_s):
                await backend.wait_settled()
        except TimeoutError:
            pass  # those still connecting are told as such below
        starting = backend.unsettled()
        return {
            name: f"still starting after {budget_s:g} s"
            if name in starting
            else server.last_error or "no reason given"
            for name, server in backend.summaries().items()
            if server.state != "ready"
        }


def sources(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> str:
    """Which configuration was read, and which MCP servers it names."""
    files = [str(path) for path in (args.config, args.mcp_config) if path is not None]
    read = (
        f"read {' and '.join(files)}"
        if files
        else "no configuration file given (--config, --mcp-config): the defaults"
    )
    if any(name.startswith("TOOLBUS_") for name in environ):
        read += ", with TOOLBUS_* environment variables"
    enabled = [name for name, server in settings.mcp_servers.items() if not server.disabled]
    return f"{read}; MCP servers: {', '.join(enabled) or 'none'}"
