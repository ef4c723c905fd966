"""The `toolbus status` command line: the pool's retained statuses as tables or JSON.

Imported whenever `toolbus` builds its parser, so it imports nothing heavy at the top:
the view (rich, the transport) loads only when `status` runs. `--once` prints a
snapshot and exits; `--json` prints it as JSON for scripts (implies `--once`); otherwise
a live view until Ctrl-C (see `status_view`). Exit codes: 0 shown, 2 a usage or
configuration error (cli.py), 3 (`--once`, `--json`) shown but no worker is online:
nobody would answer a call (`toolbus call` exits 5 for it, having sent nothing; 3 is
status's from before), 4 the broker cannot be reached within `--timeout` or refuses
the login. `--client-id` (`TOOLBUS_CLIENT_ID`) as for `call`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

EXIT_OK, EXIT_NO_WORKER, EXIT_BROKER = 0, 3, 4  # 3: exit_codes' EXIT_NO_REPLY, kept


def add_arguments(status: argparse.ArgumentParser) -> None:
    status.description = (
        "Workers (online/offline, since when, requests in flight and handled) and MCP "
        "servers (state at each worker, last error) from the retained status topics."
    )
    status.add_argument(
        "--once",
        action="store_true",
        help="print a snapshot once the retained statuses are in; exit 3 when no worker is online",
    )
    status.add_argument(
        "--json", action="store_true", help="print the snapshot as JSON (implies --once)"
    )
    status.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds to reach the broker (and, with --once, to gather); default 5",
    )


def run(args: argparse.Namespace) -> int:
    from toolbus.cli.settings import client_id, refused
    from toolbus.cli.status_view import live, once
    from toolbus.config import load_settings
    from toolbus.transport import BrokerRefused, TransportError
    from toolbus.wire.topics import Topics
    from toolbus.wire.untrusted import printable

    if args.timeout <= 0:
        raise ValueError("--timeout must be above 0")
    settings = load_settings(args.config, None, broker_url=args.broker)
    # Only the prefix matters here (wiring.topics_for would import the whole worker).
    topics = Topics(settings.topic_prefix, settings.shared_group, settings.allowed_reply_prefixes)
    # A random id made here, not in the connection: a refusal names the id it came with.
    ident = client_id(args, settings) or f"toolbus-status-{uuid.uuid4().hex[:12]}"
    try:
        if not (args.once or args.json):
            asyncio.run(live(settings.brokers, topics, args.timeout, ident))  # until Ctrl-C
            return EXIT_OK
        pool = _read(settings.brokers, topics, args, ident, once)
    except BrokerRefused as exc:  # in the words `call` and `tools` use (docs/security.md)
        print(f"toolbus: {printable(refused(settings, ident, exc))}", file=sys.stderr)
        return EXIT_BROKER
    except (TransportError, TimeoutError) as exc:
        why = str(exc) or f"no connection within {args.timeout} s"
        unreached = f"cannot reach the broker at {settings.broker}: {why}"
        print(f"toolbus: {printable(unreached)}", file=sys.stderr)
        return EXIT_BROKER
    except KeyboardInterrupt:
        return EXIT_OK  # the live view's way out
    if not any(worker.state == "online" for worker in pool.workers()):
        print(f"toolbus: {printable(f'no worker online under {topics.prefix}/')}", file=sys.stderr)
        return EXIT_NO_WORKER
    return EXIT_OK


def _read(brokers: Any, topics: Any, args: argparse.Namespace, ident: str, once: Any) -> Any:
    """The statuses, from the first node that answers; with several nodes, which one was
    read (on a cluster whose retained messages stay on the node that took them, such as
    ejabberd, one node's are a part: each worker's status is on the node it is on)."""
    from toolbus.transport import BrokerRefused, TransportError
    from toolbus.wire.untrusted import printable

    for n, broker in enumerate(brokers):
        try:
            shown = once(broker, topics, args.timeout, as_json=args.json, client_id=ident)
            pool = asyncio.run(shown)
        except BrokerRefused:
            raise
        except (TransportError, TimeoutError):
            if n == len(brokers) - 1:
                raise
            continue
        if len(brokers) > 1:
            print(f"toolbus: statuses read from {printable(str(broker))}", file=sys.stderr)
        return pool
    raise AssertionError("unreachable: the last node's error is raised")
