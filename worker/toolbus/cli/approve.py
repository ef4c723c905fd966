"""`toolbus approve`: a person at a terminal approves a call a worker holds for approval.

Two ways in. `toolbus approve TOOL key=value ...` (the arguments as `toolbus call` takes
them) sends the call as `--caller`; a call no gate holds is simply answered. One that is
answered `approval_required` is shown (the tool and its arguments as they would run, why
it is gated, how long the approval lasts) and the person is asked; on yes the same call
is sent again, with the same id and the approval, and its reply printed; on no nothing
more is sent. `toolbus approve --reply FILE` (`-`: stdin) starts from an
`approval_required` reply someone else got (`toolbus call --json-reply`, an agent's log:
a `Reply`, or a `CallsReply` holding one), shows it, asks, and on yes sends its call with
its approval, as `--caller`, who must be the caller it was made for (a token binds its
caller). The answer is read from the terminal, or from stdin when it is not one (`y`/
`yes`; anything else, or nothing, is no); `--yes` answers yes without asking. Exit codes
as `toolbus call`'s: 0 the call ran and succeeded, 1 an error reply or not approved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from toolbus.cli import values as cli_values
from toolbus.cli.settings import _settings
from toolbus.wire.contracts import CallsReply, ErrorCode, Reply
from toolbus.wire.untrusted import printable
from toolbus.worker.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE


def add_arguments(approve: argparse.ArgumentParser) -> None:
    approve.add_argument("tool", nargs="?", help="the tool to call (not with --reply)")
    approve.add_argument(
        "pairs",
        nargs="*",
        default=[],
        type=cli_values.pair,
        metavar="key=value|key:=JSON",
        help="arguments, as `toolbus call` takes them",
    )
    approve.add_argument(
        "--json",
        dest="json_args",
        type=cli_values.json_object,
        metavar="OBJECT",
        help="arguments as a JSON object (pairs given too win over its keys)",
    )
    approve.add_argument(
        "--reply",
        metavar="FILE",
        help="an approval_required reply (JSON; - for stdin): approve its call",
    )
    approve.add_argument(
        "--yes", action="store_true", help="approve without asking (a script that decided)"
    )
    approve.add_argument("--caller", metavar="NAME", help="who calls (a token binds its caller)")
    approve.add_argument("--timeout", type=float, help="each send's deadline in seconds")
    approve.add_argument(
        "--json-reply", action="store_true", help="print the whole reply as JSON, an error too"
    )
    approve.add_argument(
        "--no-worker-check", action="store_true", help="send even when no worker shows online"
    )


def gated(reply: Reply | CallsReply) -> Reply | None:
    """The `approval_required` answer a reply holds (a message's first), or None."""
    replies = reply.results if isinstance(reply, CallsReply) else [reply]
    for one in replies:
        if one.error is not None and one.error.code == ErrorCode.APPROVAL_REQUIRED:
            return one
    return None


def approve(args: argparse.Namespace) -> int:
    """Shown, asked, sent on yes: see the module's docstring."""
    # Imported here: every command's parser reads this module (`add_arguments`), and
    # `ask` brings the client and rich's console, which `toolbus serve` never uses.
    from toolbus.cli.ask import _client, _talk  # noqa: PLC0415 -- see above

    if (args.tool is None) == (args.reply is None):
        print("toolbus: approve needs a TOOL to call, or --reply FILE", file=sys.stderr)
        return EXIT_USAGE
    held = _read_reply(args.reply) if args.reply is not None else None
    settings = _settings(args)
    client = _client(args, settings)
    in_topic = settings.caller_identity == "topic" and args.caller

    def sent(tool: str, body: dict[str, Any]) -> Awaitable[Reply | CallsReply]:
        if in_topic:
            return client.request(f"{settings.topic_prefix}/call/{args.caller}/{tool}", body)
        named = {"tool": tool, **body, **({"caller": args.caller} if args.caller else {})}
        return client.request(f"{settings.topic_prefix}/call", named)

    async def talk() -> Reply | CallsReply | int:
        async with client:
            ident = uuid.uuid4().hex
            arguments = cli_values.arguments(args.pairs, args.json_args)
            tool = args.tool
            if held is None:
                first = await sent(tool, {"id": ident, "arguments": arguments})
                asked = gated(first)
                if asked is None:
                    return first  # no gate holds it: answered as any call
            else:
                asked = held
            held_call = _held_call(asked)
            if held_call is None:
                print("toolbus: the reply holds no call to approve", file=sys.stderr)
                return EXIT_USAGE
            shown_tool, shown_arguments, approval = held_call
            if not await asyncio.to_thread(_agreed, asked, args.yes):
                print("toolbus: not approved; nothing sent", file=sys.stderr)
                return EXIT_ERROR
            if held is not None:  # only the call as it would run is known: that is sent
                tool, arguments = shown_tool, shown_arguments
            body = {"id": ident, "arguments": arguments, "approval": approval}
            return await sent(tool, body)

    answer = _talk(settings, client, talk())
    if isinstance(answer, int):
        return answer
    return _printed(answer, args.json_reply)


def _read_reply(where: str) -> Reply:
    """The `approval_required` reply in `where` (`-`: stdin); ValueError: exit 2."""
    text = sys.stdin.read() if where == "-" else Path(where).read_text()
    try:
        raw = json.loads(text)
        reply: Reply | CallsReply = (
            CallsReply.model_validate(raw) if "results" in raw else Reply.model_validate(raw)
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--reply: not a toolbus reply: {exc}") from None
    asked = gated(reply)
    if asked is None:
        raise ValueError("--reply: not an approval_required reply")
    return asked


def _held_call(asked: Reply) -> tuple[str, dict[str, Any], str] | None:
    """The tool, arguments (as they would run) and approval of an `approval_required`."""
    details = asked.error.details if asked.error is not None else {}
    call, approval = details.get("call"), details.get("approval")
    if not isinstance(call, dict) or not isinstance(approval, str):
        return None
    tool, arguments = call.get("tool"), call.get("arguments")
    if not isinstance(tool, str) or not isinstance(arguments, dict):
        return None
    return tool, arguments, approval


def _agreed(asked: Reply, yes: bool) -> bool:
    """Shown on stderr, then asked (a blocking read: run in a thread)."""
    details = asked.error.details if asked.error is not None else {}
    tool, arguments, _ = _held_call(asked) or ("?", {}, "")
    lines = [
        f"toolbus: {asked.id} needs a person's approval ({details.get('reason')}):",
        f"  tool:      {tool}",
        f"  arguments: {json.dumps(arguments, indent=2, ensure_ascii=False)}",
        f"  (the approval lasts {details.get('expires_in_s')} s)",
    ]
    for line in lines:  # a model chose the arguments: no terminal controls pass
        print(printable(line, newlines=True), file=sys.stderr)
    if yes:
        print("toolbus: approved (--yes)", file=sys.stderr)
        return True
    print("Run it? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


def _printed(reply: Reply | CallsReply, whole: bool) -> int:
    """As `toolbus call` prints it; the exit code by its outcome."""
    from toolbus.cli.ask import _json, one_line  # noqa: PLC0415 -- as in `approve`

    if isinstance(reply, Reply) and not reply.ok and not whole and sys.stdout.isatty():
        print(f"toolbus: {printable(one_line(reply, '--json-reply'))}", file=sys.stderr)
        return EXIT_ERROR
    print(_json(reply.model_dump_json(by_alias=True, exclude_none=True, indent=2)))
    return EXIT_OK if reply.ok else EXIT_ERROR
