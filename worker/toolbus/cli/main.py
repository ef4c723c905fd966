"""Command line: toolbus serve | call | approve | tools | status | health | mappings | schemas |
bench | demo-server.

This is the entry point: the only place that reads the environment and files.
Exit codes of `call`/`tools`: 0 ok, 1 the tool or worker answered with an error,
2 usage or configuration error, 3 no reply in time, 4 broker unreachable or refusing the
login, 5 no worker online (the retained statuses say so; nothing sent). Any command whose
stdout is closed early (`| head`) exits 141, quietly, as one that SIGPIPE ends. `serve`
exits 2 on a configuration error and 4 when the broker refuses it at the first connect
(its certificate fails verification, or it rejects the credentials) or its shared dedup
store cannot be reached at start-up. A configuration
error is printed one problem per line (see `toolbus.config.problems`). `call` and
`tools` live in `cli_ask` (what `call` was typed as, in `cli_values`); `status` and
`mappings` in their `*_command` modules, with their own exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pydantic import ValidationError

from toolbus import __version__
from toolbus.cli.asking import asking_arguments, client_id_argument
from toolbus.cli.settings import _settings, config_errors
from toolbus.config.problems import ConfigError
from toolbus.wire.untrusted import printable
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_ERROR, EXIT_OK, EXIT_PIPE, EXIT_USAGE

if TYPE_CHECKING:
    from toolbus.config import Settings

SCHEMAS_DIR = Path("schemas")
ASYNCAPI_PATH = Path("docs/asyncapi.yaml")


class _Parser(argparse.ArgumentParser):
    """A parser whose error lines are printable: a script may hand `toolbus call` what a
    model or a caller chose, and argparse quotes some of it as typed."""

    def error(self, message: str) -> NoReturn:
        super().error(printable(message))


class _IntermixedParser(_Parser):
    """A subcommand's parser whose positionals and options may come in any order
    (`toolbus call echo --timeout 5 text=hi`). argparse does that only in
    `parse_intermixed_args`, which refuses a parser with subcommands, so each
    subcommand's parser (none has subcommands) parses itself that way."""

    _inner = False

    def parse_known_args(  # type: ignore[override]  # typeshed overloads; same signature
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inner:  # the two passes `parse_known_intermixed_args` makes
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="toolbus",
        description="Execute AI tool calls arriving over MQTT, and talk to the workers that do.",
        epilog="Exit codes: 0 ok; 1 the tool or worker answered with an error (health: "
        "unhealthy; mappings: unknown tool or a server down); 2 usage or configuration "
        "error; 3 no reply in time (status --once: no worker online); 4 broker "
        "unreachable or refusing (serve: or the dedup store out of reach at start-up); "
        "5 call, tools: no worker online, not sent; 141 stdout closed early (| head). "
        "`toolbus COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"toolbus {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, help="what to do", parser_class=_IntermixedParser
    )

    def config_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="config file (TOML or JSON)")
        p.add_argument(
            "--broker",
            help="mqtt://[user@]host:port or mqtts:// (env TOOLBUS_BROKER_URL); the password "
            "from TOOLBUS_BROKER_PASSWORD or TOOLBUS_BROKER_PASSWORD_FILE",
        )

    serve = sub.add_parser("serve", help="run the worker")
    config_flags(serve)
    serve.add_argument("--mcp-config", type=Path, help="MCP client config file with mcpServers")
    serve.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="worker processes on the shared subscription, supervised (env TOOLBUS_PROCESSES)",
    )

    call = sub.add_parser("call", help="call a tool through a running worker")
    config_flags(call)
    tools = sub.add_parser("tools", help="list the tools of a running worker")
    config_flags(tools)
    asking_arguments(call, tools)

    from toolbus.cli.health import add_arguments as health_arguments

    health_arguments(sub.add_parser("health", help="exit 0 when a worker's /readyz answers 200"))

    schemas = sub.add_parser(
        "schemas", help="write or check schemas/*.json and the AsyncAPI document"
    )
    mode = schemas.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="render them from the code")
    mode.add_argument(
        "--check", action="store_true", help="exit 1 when a file differs from the code (for CI)"
    )
    schemas.add_argument(
        "--dir", type=Path, default=SCHEMAS_DIR, help="the JSON Schemas' folder (default: schemas)"
    )
    schemas.add_argument(
        "--asyncapi", type=Path, default=ASYNCAPI_PATH, help="the AsyncAPI document's path"
    )

    from toolbus.cli.mappings import add_arguments as mappings_arguments

    mappings_arguments(
        sub.add_parser("mappings", help="print every accepted spelling per tool (Markdown)")
    )

    from toolbus.cli.bench.command import add_arguments as bench_arguments

    bench_arguments(
        sub.add_parser(
            "bench", help="measure the worker against a bare aiomqtt echo and a raw MCP session"
        )
    )

    from toolbus.cli.status import add_arguments as status_arguments

    status = sub.add_parser("status", help="show the workers and MCP servers, live or once")
    config_flags(status)
    status_arguments(status)
    from toolbus.cli.approve import add_arguments as approve_arguments

    approve = sub.add_parser(
        "approve", help="call a tool a person must approve: show the call, ask, send"
    )
    config_flags(approve)
    approve_arguments(approve)
    client_id_argument(call, tools, status, approve)

    demo = sub.add_parser("demo-server", help="run the demo MCP device server on stdio")
    demo.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP on /mcp instead")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "serve":
        gc.enable()  # off while the program started (`cli.entry`); `serve` turns it on
    handlers = {
        "serve": _serve,
        "call": _call,
        "tools": _tools,
        "schemas": _schemas,
        "demo-server": _demo_server,
        "bench": _bench,
        "mappings": _mappings,
        "health": _health,
        "status": _status,
        "approve": _approve,
    }
    try:
        code: int = handlers[args.command](args)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not at exit
    except BrokenPipeError:
        return _pipe_closed()
    except ConfigError as exc:
        for problem in exc.problems:  # one line each (printable): a log line, a grep hit
            print(f"toolbus: bad configuration: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except ValidationError as exc:
        print(f"toolbus: bad configuration: {config_errors(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as exc:
        print(f"toolbus: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    return code


def _approve(args: argparse.Namespace) -> int:
    from toolbus.cli.approve import approve

    return approve(args)


def _pipe_closed() -> int:
    """stdout's reader is gone: quiet, 141 as a shell reports a command SIGPIPE ended.
    stdout is pointed at /dev/null, or Python's own flush at exit fails again, loudly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_PIPE


def _serve(args: argparse.Namespace) -> int:
    from toolbus.observability.logs import setup_logging

    settings = _settings(args)
    setup_logging(settings.log_level, settings.log_format)
    if settings.processes > 1:  # children, supervised; with 1, nothing between
        gc.enable()
        from toolbus.worker.supervisor import supervise

        given = {"--config": args.config, "--mcp-config": args.mcp_config, "--broker": args.broker}
        return supervise(settings, [p for f, v in given.items() if v for p in (f, str(v))])
    from toolbus.worker.supervisor import die_with_supervisor

    die_with_supervisor(os.environ)  # a supervised child ends with its supervisor

    from toolbus.backends.local import BUILTIN_TOOLS
    from toolbus.backends.local.functions import load_entry_points
    from toolbus.dedup.store import StoreUnreachable
    from toolbus.observability.sdk import (
        child_environment,
        configure_metrics,
        configure_tracing,
        settle_for_tracing,
    )
    from toolbus.transport import BrokerRefused
    from toolbus.worker.wiring import build_worker, serve_http

    kept = _kept_secret(settings)  # before anything starts: a refusal is exit 2
    provider = configure_tracing(record_for_callers=settings.publish_traces)
    meters = configure_metrics(prometheus=settings.http_port is not None)
    worker = build_worker(
        settings,
        [*BUILTIN_TOOLS, *load_entry_points()],
        child_env=child_environment(),
        kept_secret=kept,
    )
    # The start-up heap (modules, models, the worker) lives as long as the process: left
    # out of every collection from here (`cli.entry` kept the collector off until now).
    gc.freeze()
    gc.enable()
    if provider is not None:
        settle_for_tracing()  # once everything the worker needs is loaded

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with serve_http(settings, worker):
            await worker.run(stop)

    try:
        asyncio.run(run())
    except BrokerRefused as exc:  # at the first connect: the configuration is wrong
        refused = f"cannot connect to the broker at {settings.broker}: {exc}"
        print(f"toolbus: {printable(refused)}", file=sys.stderr)
        return EXIT_BROKER
    except StoreUnreachable as exc:  # likewise, for the shared dedup store
        print(f"toolbus: {printable(str(exc))}", file=sys.stderr)
        return EXIT_BROKER
    finally:
        if provider is not None:
            provider.shutdown()  # flushes the spans still batched
        if meters is not None:
            meters.shutdown()
    return EXIT_OK


def _kept_secret(settings: Settings) -> bytes | None:
    """`client_id_secret_file`'s secret when it keys the client ids (a worker_id, no
    `client_id_secret`): read, or made, here, where files are read. A file others may
    write, or a short secret, is a ValueError (exit 2); one others may read, a warning."""
    from toolbus.worker.client_ids import kept_secret

    path = settings.client_id_secret_file
    if settings.worker_id is None or settings.client_id_secret is not None or path is None:
        return None
    kept = kept_secret(path)
    for concern in kept.concerns:
        print(f"toolbus: warning: {printable(concern)}", file=sys.stderr)
    return kept.secret


def _call(args: argparse.Namespace) -> int:
    from toolbus.cli.ask import call

    return call(args)


def _tools(args: argparse.Namespace) -> int:
    from toolbus.cli.ask import tools

    return tools(args)


def _schemas(args: argparse.Namespace) -> int:
    from toolbus.wire.contracts import check_schemas, write_schemas

    try:
        from toolbus.cli import asyncapi
    except ModuleNotFoundError as exc:  # PyYAML: a development dependency
        print(f"toolbus schemas needs {exc.name}: pip install 'toolbus[dev]'", file=sys.stderr)
        return EXIT_USAGE

    if args.write:
        for path in [*write_schemas(args.dir), asyncapi.write(args.asyncapi)]:
            print(f"wrote {path}")
        return EXIT_OK
    drifted = check_schemas(args.dir)
    if not asyncapi.check(args.asyncapi):
        drifted.append(str(args.asyncapi))
    if drifted:
        print(
            f"schemas drifted from the code: {', '.join(drifted)}; run `toolbus schemas --write`",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(f"schemas in {args.dir} and {args.asyncapi} match the code")
    return EXIT_OK


def _mappings(args: argparse.Namespace) -> int:
    from toolbus.cli.mappings import run

    return run(args, _settings(args), os.environ)


def _health(args: argparse.Namespace) -> int:
    from toolbus.cli.health import run

    return run(args)


def _bench(args: argparse.Namespace) -> int:
    from toolbus.cli.bench.command import run

    return run(args)


def _status(args: argparse.Namespace) -> int:
    from toolbus.cli.status import run

    return run(args)


def _demo_server(args: argparse.Namespace) -> int:
    from toolbus.cli.demo.server import main as demo_main
    from toolbus.observability.sdk import configure_tracing

    # Instrumented like any MCP server should be: it continues the caller's trace
    # from each request's _meta and exports with the OTEL_* settings it inherits.
    provider = configure_tracing(service_name="toolbus-demo-devices")
    try:
        demo_main(args.http)
    finally:
        if provider is not None:
            provider.shutdown()
    return EXIT_OK
