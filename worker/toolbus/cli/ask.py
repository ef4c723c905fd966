"""Asking a running worker from the command line: `toolbus call` and `toolbus tools`.

Both go through `toolbus.Client`; what cannot reach anyone becomes an exit code
(`toolbus.worker.exit_codes`'s): 3 no reply in time, 4 the broker unreachable within `--timeout`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from toolbus.cli import values as cli_values
from toolbus.cli.settings import _settings
from toolbus.client.client import Client, Retry
from toolbus.transport import TransportError
from toolbus.wire.contracts import ToolsFormat
from toolbus.wire.errors import NoReply, ToolbusError
from toolbus.wire.untrusted import printable
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_ERROR, EXIT_NO_REPLY, EXIT_OK


def _client(args: argparse.Namespace, settings: Any) -> Client:
    """A `Client` as the settings and flags say; a bad `--attempts` is a usage error.
    `--timeout` bounds the connect too (TCP, TLS, CONNACK; 10 s at most)."""
    timeout_s = settings.default_timeout_s if args.timeout is None else args.timeout
    return Client(
        settings.broker,
        prefix=settings.topic_prefix,
        reply_prefix=settings.allowed_reply_prefixes[0],
        retry=Retry(getattr(args, "attempts", 3), getattr(args, "retry_interval", 5.0)),
        connect_timeout_s=min(timeout_s, 10.0),
        timeout_s=timeout_s,  # 0 or below: the Client refuses it, a usage error
        on_resend=_tell_resend,
        caller=args.caller,
        caller_identity=settings.caller_identity,
    )


def _tell_resend(send: int, sends: int) -> None:
    """The user waits on: say why nothing has come yet, and that it is sent again."""
    print(f"toolbus: no reply yet, sending again ({send}/{sends})", file=sys.stderr, flush=True)


def _talk(settings: Any, talk: Any) -> Any:
    """Run `talk` (a coroutine), its failures to reach anyone as exit codes."""
    try:
        return asyncio.run(talk)
    except NoReply as exc:
        # A copy was answered (that it did not run): a worker is there; the outcome is unknown.
        hint = "" if exc.answer is not None else " (is a worker running?)"
        print(f"toolbus: {printable(str(exc))}{hint}", file=sys.stderr)
        return EXIT_NO_REPLY
    except TransportError as exc:
        unreached = f"cannot reach the broker at {settings.broker}: {exc}"
        print(f"toolbus: {printable(unreached)}", file=sys.stderr)
        return EXIT_BROKER


def _json(text: str) -> str:
    """JSON for the terminal: a string's C0 controls are escaped by every encoder, its C1
    controls and DEL (U+009B is a CSI) by none; escaped here, the same JSON value."""
    return printable(text, newlines=True)


def call(args: argparse.Namespace) -> int:
    """The reply as JSON; the exit code by its outcome."""
    arguments = cli_values.arguments(args.pairs, args.json_args)
    settings = _settings(args)
    client = _client(args, settings)

    async def talk() -> Any:
        async with client:
            try:
                return await client.call(args.tool, arguments)
            except ToolbusError as error:
                if error.reply is None:
                    raise
                return error.reply  # the worker's own answer, printed as it came

    reply = _talk(settings, talk())
    if isinstance(reply, int):
        return reply
    print(_json(reply.model_dump_json(by_alias=True, exclude_none=True, indent=2)))
    return EXIT_OK if reply.ok else EXIT_ERROR


def tools(args: argparse.Namespace) -> int:
    """Ours as a table (`--json`: as JSON); a provider's format as JSON, for its SDK."""
    settings = _settings(args)
    client = _client(args, settings)

    async def talk() -> Any:
        async with client:
            try:
                return await client.tool_list(args.format)
            except ToolbusError as error:
                if error.reply is None:
                    raise
                print(_json(error.reply.model_dump_json(indent=2)), file=sys.stderr)
                return EXIT_ERROR

    listed = _talk(settings, talk())
    if isinstance(listed, int):
        return listed
    definitions, pending = listed
    if pending:  # the list is as complete as the worker could make it in time: say so
        servers = ", ".join(f"{p.get('server')} ({p.get('state')})" for p in pending)
        note = f"MCP servers not ready, their tools may be missing: {servers}"
        print(f"toolbus: {printable(note)}", file=sys.stderr)
    ours = args.format == ToolsFormat.TOOLBUS
    # A provider's format is asked for to be pasted into its SDK's `tools=`: JSON.
    if args.json or not ours:
        print(_json(json.dumps(definitions, indent=2)))
        return EXIT_OK
    table = Table("tool", "origin", "parameters", "description")
    for tool in definitions:
        schema = tool.get("inputSchema") or {}
        required = set(schema.get("required", []))
        params = ", ".join(
            f"{name}{'' if name in required else '?'}" for name in schema.get("properties", {})
        )
        description = (tool.get("description") or "")[:80]
        # A server chose every cell: plain text (no rich markup), no terminal controls.
        cells = (tool["name"], tool["origin"], params, description)
        table.add_row(*(Text(printable(str(cell))) for cell in cells))
    # Piped: rich would fit the table to 80 columns and cut names that a grep needs.
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return EXIT_OK
