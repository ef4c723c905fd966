"""The flags of `toolbus call` and `toolbus tools`, and `--client-id` (theirs and
`toolbus status`'s). Light on purpose: read whenever `toolbus` builds its parser."""

from __future__ import annotations

import argparse

from toolbus.cli.values import json_object, pair
from toolbus.wire.contracts import ToolsFormat


def asking_arguments(call: argparse.ArgumentParser, tools: argparse.ArgumentParser) -> None:
    """`call`'s tool, arguments and flags, and the flags both share or `tools` has."""
    call.add_argument("tool", help="the tool's name, or any alias or spelling that resolves")
    call.add_argument(
        "pairs",
        nargs="*",
        default=[],  # none is fine: argparse would call a `*` without a default required
        type=pair,
        metavar="key=value|key:=JSON",
        help='arguments: key=value sends the text value (n=5 sends "5"); key:=JSON sends '
        "the JSON value (n:=5, on:=true); options may stand between them",
    )
    call.add_argument(
        "--json",
        dest="json_args",
        type=json_object,
        metavar="OBJECT",
        help="arguments as a JSON object (pairs given too win over its keys)",
    )
    call.add_argument(
        "--json-reply",
        action="store_true",
        help="print the whole reply as JSON, an error reply too (what a pipe gets anyway; "
        "on a terminal an error reply is one line on stderr)",
    )
    call.add_argument(
        "--timeout",
        type=float,
        help="the call's deadline in seconds (default: default_timeout_s, as the worker has "
        "it); connecting to the broker is bounded by it too, 10 s at most",
    )
    call.add_argument(
        "--progress",
        action="store_true",
        help="ask for the call's progress and show it on stderr: a progress bar on a "
        "terminal, a line per update when piped",
    )
    call.add_argument(
        "--task",
        action="store_true",
        help="run the call as a task on the worker (it survives this command's connection "
        "dropping; re-sent under the same id it is the same task) and wait for its end",
    )
    call.add_argument(
        "--extend-on-progress",
        action="store_true",
        help="let each progress update restart the deadline on the worker (up to the "
        "tool's max_timeout_s)",
    )
    call.add_argument(
        "--attempts",
        type=int,
        default=3,
        help="sends in all, the same id each time, while no reply comes (1: no re-send); "
        "each re-send is told on stderr",
    )
    call.add_argument(
        "--retry-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="send again after S seconds without a reply (default 5)",
    )

    for asking in (call, tools):
        asking.add_argument(
            "--no-worker-check",
            action="store_true",
            help="send even when the workers' retained statuses show none online (by "
            "default nothing is sent then, exit 5, within about a second)",
        )
        asking.add_argument(
            "--caller",
            metavar="NAME",
            help="who is asking (the workers' caller profiles and quotas): named in the "
            "request, or by the topic when the configuration's caller_identity is `topic` "
            "(then it is the broker login the ACL ties to it)",
        )
    tools.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="seconds to wait for a worker, and for the broker connection (10 s at most)",
    )
    tools.add_argument(
        "--json", action="store_true", help="print our definitions as JSON, not as a table"
    )
    tools.add_argument(
        "--format",
        choices=[f.value for f in ToolsFormat],
        default=ToolsFormat.TOOLBUS.value,
        help="the definitions' shape: ours (default; a table unless --json), or what a "
        "provider's SDK takes, printed as that JSON",
    )


def client_id_argument(*parsers: argparse.ArgumentParser) -> None:
    """`--client-id` (see `cli.settings.client_id` for its default)."""
    for connecting in parsers:
        connecting.add_argument(
            "--client-id",
            type=_client_id,
            metavar="ID",
            help="the MQTT client id (env TOOLBUS_CLIENT_ID; default: the broker login when "
            "caller_identity is topic, as a broker binding logins to client ids needs, "
            "else random)",
        )


def _client_id(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an empty client id")
    return text
