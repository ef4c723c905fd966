"""Asking a running worker from the command line: `toolbus call` and `toolbus tools`.

Both go through `toolbus.Client`, as the client id `client_id` chooses (`--client-id`,
`TOOLBUS_CLIENT_ID`; by default the login where the caller is the topic's), checking the
workers' retained statuses first (`--no-worker-check` sends regardless). What cannot
reach anyone becomes an exit code (`toolbus.worker.exit_codes`'s): 3 no reply in time, 4
the broker unreachable within `--timeout`, refusing the login or the request (its ACL:
PUBACK 0x87, said at once), or another command taking the client id, 5 no worker online
(not sent). An error reply is one line on a terminal (`code: message`, and when to retry);
piped, or with `--json-reply`, the whole reply as JSON, as ever. `--progress` shows the
call's progress on stderr (cli/progress_view.py).

On a terminal (standard input one) `call` answers what the tool asks and approves a gated
call by asking the person (cli/prompts.py); otherwise it says nothing of `input`, so the
workers decline the tool's questions for it, and a gated call's `approval_required` is
printed as the error it is (its token for `toolbus approve`), never waited on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from toolbus.cli import values as cli_values
from toolbus.cli.progress_view import ProgressView
from toolbus.cli.prompts import Prompter
from toolbus.cli.settings import _settings, client_id, refused
from toolbus.client.client import Client, Retry
from toolbus.client.tasks import run_task
from toolbus.transport import BrokerRefused, SessionTakenOver, TransportError
from toolbus.wire.contracts import Reply, ToolsFormat
from toolbus.wire.errors import NoReply, NoWorker, RequestRefused, ToolbusError
from toolbus.wire.untrusted import printable
from toolbus.worker.exit_codes import (
    EXIT_BROKER,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NO_REPLY,
    EXIT_NO_WORKER,
    EXIT_OK,
)


def _client(args: argparse.Namespace, settings: Any) -> Client:
    """A `Client` as the settings and flags say; a bad `--attempts` is a usage error.
    `--timeout` bounds the connect too (TCP, TLS, CONNACK; 10 s at most)."""
    timeout_s = settings.default_timeout_s if args.timeout is None else args.timeout
    return Client(
        settings.brokers,
        prefix=settings.topic_prefix,
        reply_prefix=settings.allowed_reply_prefixes[0],
        retry=Retry(getattr(args, "attempts", 3), getattr(args, "retry_interval", 5.0)),
        connect_timeout_s=min(timeout_s, 10.0),
        timeout_s=timeout_s,  # 0 or below: the Client refuses it, a usage error
        on_resend=_tell_resend,
        caller=args.caller,
        caller_identity=settings.caller_identity,
        client_id=client_id(args, settings),
        require_worker=not args.no_worker_check,
        fail_when_taken_over=True,  # two commands at once with one id: say so, once
        keepalive_s=settings.keepalive_s,
    )


def _tell_resend(send: int, sends: int) -> None:
    """The user waits on: say why nothing has come yet, and that it is sent again."""
    print(f"toolbus: no reply yet, sending again ({send}/{sends})", file=sys.stderr, flush=True)


def _talk(settings: Any, client: Client, talk: Any) -> Any:
    """Run `talk` (a coroutine), its failures to reach anyone as exit codes. Ctrl-C
    cancels it: the client tells the workers (`client/cancelling.py`), then 130."""
    try:
        return _reaching(settings, client, talk)
    except KeyboardInterrupt:
        print("toolbus: interrupted; the call was cancelled", file=sys.stderr)
        return EXIT_INTERRUPTED


def _reaching(settings: Any, client: Client, talk: Any) -> Any:
    try:
        return asyncio.run(talk)
    except (RequestRefused, SessionTakenOver) as exc:
        print(f"toolbus: {printable(_refusal(exc))}", file=sys.stderr)
        return EXIT_BROKER
    except NoWorker as exc:  # before NoReply, its base: nothing was sent
        print(f"toolbus: {printable(str(exc))}; not sent", file=sys.stderr)
        return EXIT_NO_WORKER
    except NoReply as exc:
        # A copy was answered (that it did not run): a worker is there; the outcome is unknown.
        hint = "" if exc.answer is not None else " (is a worker running?)"
        print(f"toolbus: {printable(str(exc))}{hint}", file=sys.stderr)
        return EXIT_NO_REPLY
    except BrokerRefused as exc:
        print(f"toolbus: {printable(refused(settings, client.client_id, exc))}", file=sys.stderr)
        return EXIT_BROKER
    except TransportError as exc:
        unreached = f"cannot reach the broker at {settings.broker}: {exc}"
        print(f"toolbus: {printable(unreached)}", file=sys.stderr)
        return EXIT_BROKER


def _refusal(exc: RequestRefused | SessionTakenOver) -> str:
    """The broker would not take the request (its ACL: a repeat is refused alike), or
    another command took this one's client id."""
    if isinstance(exc, RequestRefused):
        return f"{exc}; not sent"
    return (
        f"{exc}: two commands at once need distinct client ids (--client-id or "
        "TOOLBUS_CLIENT_ID; a broker binding the login to one client id allows one at a time)"
    )


def one_line(reply: Reply, whole: str | None = None) -> str:
    """An error reply as one line for a person: `code: message`, when to send it again,
    and the flag (`whole`) that prints all of it."""
    error = reply.error
    if error is None:
        return "failed without an error"
    hints = []
    retry_after_ms = error.details.get("retry_after_ms")
    if isinstance(retry_after_ms, int | float):
        hints.append(f"retry after {retry_after_ms / 1000:g} s")
    if whole is not None:
        hints.append(f"{whole} for the whole reply")
    told = f" ({'; '.join(hints)})" if hints else ""
    return f"{error.code.value}: {error.message}{told}"


def _json(text: str) -> str:
    """JSON for the terminal: a string's C0 controls are escaped by every encoder, its C1
    controls and DEL (U+009B is a CSI) by none; escaped here, the same JSON value."""
    return printable(text, newlines=True)


def call(args: argparse.Namespace) -> int:
    """The reply as JSON; the exit code by its outcome."""
    arguments = cli_values.arguments(args.pairs, args.json_args)
    settings = _settings(args)
    client = _client(args, settings)

    view = ProgressView(sys.stderr) if args.progress else None
    # A person there to answer: asked; else nobody waits on a question (stdin piped).
    person = Prompter.terminal().callbacks() if sys.stdin.isatty() else {}

    async def talk() -> Any:
        async with client:
            try:
                if args.task:
                    return await run_task(
                        client,
                        args.tool,
                        arguments,
                        on_progress=view,
                        extend_on_progress=args.extend_on_progress,
                    )
                return await client.call(
                    args.tool,
                    arguments,
                    on_progress=view,
                    extend_on_progress=args.extend_on_progress,
                    **person,
                )
            except ToolbusError as error:
                if error.reply is None:
                    raise
                return error.reply  # the worker's own answer, printed as it came

    with view or contextlib.nullcontext():
        reply = _talk(settings, client, talk())
    if isinstance(reply, int):
        return reply
    if not reply.ok and not args.json_reply and sys.stdout.isatty():
        # A person reads it: one line, not the ~80 of the whole reply.
        print(f"toolbus: {printable(one_line(reply, '--json-reply'))}", file=sys.stderr)
        return EXIT_ERROR
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
                if sys.stderr.isatty():
                    print(f"toolbus: {printable(one_line(error.reply))}", file=sys.stderr)
                else:
                    print(_json(error.reply.model_dump_json(indent=2)), file=sys.stderr)
                return EXIT_ERROR

    listed = _talk(settings, client, talk())
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
