"""The `toolbus bench` command line: its flags, and a run from them to the table and JSON.

Imported whenever `toolbus` builds its parser, so it imports nothing heavy at the top:
the bench itself (rich, the transport, subprocesses) loads only when `bench` runs.
Exit codes: 0 measured, 1 a call failed, a guard failed (guard_run.py; `--no-guards`
skips them) or the run could not measure (no span reached the sink with tracing on),
2 a usage error (cli.py turns the ValueError into it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TABLE_WIDTH = 140  # off a terminal (a file, a CI log): no row folded at 80 columns
RESPONDER_NAMES = (
    "aiomqtt-echo, faststream-echo, toolbus-echo, toolbus-mcp, raw-mcp, toolbus-echo-tracing, "
    "toolbus-echo-info"
)


def add_arguments(bench: argparse.ArgumentParser) -> None:
    bench.description = (
        "Each responder in its own process, driven by a load generator in its own process "
        "through a private mosquitto; ratios toolbus / baseline. See bench/README.md."
    )
    bench.add_argument(
        "--in-flight",
        default="1,16,64",
        metavar="N,...",
        help="requests in flight, a phase each (default 1,16,64)",
    )
    bench.add_argument("--duration-s", type=float, default=3.0, help="measured seconds a phase")
    bench.add_argument("--warmup-s", type=float, default=1.0, help="warm-up seconds a phase")
    bench.add_argument("--only", metavar="NAME,...", help=f"these responders: {RESPONDER_NAMES}")
    bench.add_argument(
        "--tracing", action="store_true", help="add toolbus echo with tracing on (OTLP export)"
    )
    bench.add_argument(
        "--logging", action="store_true", help="add toolbus echo logging at INFO (a line a call)"
    )
    bench.add_argument(
        "--processes", type=int, default=1, help="worker processes (`toolbus serve --processes`)"
    )
    bench.add_argument(
        "--loadgens",
        type=int,
        default=1,
        metavar="K",
        help="load-generator processes a phase, sharing its requests in flight (default 1)",
    )
    bench.add_argument(
        "--worker-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the workers under test, as in their config file (a JSON value "
        "or text); e.g. dispatch=store with dedup_store=redis://127.0.0.1:6379/0",
    )
    bench.add_argument(
        "--tracing-env",
        action="append",
        default=[],
        metavar="OTEL_NAME=VALUE",
        help="an OTEL_* variable of the tracing worker, e.g. OTEL_TRACES_SAMPLER="
        "parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG=0.1",
    )
    bench.add_argument(
        "--worker-tree",
        type=Path,
        metavar="DIR",
        help="run the worker from another checkout (a `git worktree`) for a before/after pair",
    )
    bench.add_argument(
        "--no-guards",
        action="store_true",
        help="skip the guards (a traced MCP call's spans, settled = full reply, call lines at "
        "INFO, progress, cancel, a repeat run once): without them a speed-up that drops "
        "behaviour passes",
    )
    bench.add_argument("--json", type=Path, metavar="PATH", help="write every figure; - for stdout")
    bench.add_argument(
        "--ids",
        action="store_true",
        help="each request with an id of its own, as toolbus.Client sends: the worker claims "
        "and records every call in its dedup store (without, it skips the store)",
    )
    bench.add_argument(
        "--latencies",
        action="store_true",
        help="with --json: every phase's latencies too (ms, in the order the replies came)",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolbus.cli.bench.phases import DEFAULT_RESPONDERS
    from toolbus.cli.bench.report import render, to_json
    from toolbus.cli.bench.run import BenchFailed, BenchOptions
    from toolbus.cli.bench.run import run as run_bench
    from toolbus.wire.untrusted import printable

    names = args.only.split(",") if args.only else list(DEFAULT_RESPONDERS)
    names += ["toolbus-echo-tracing"] if args.tracing else []
    names += ["toolbus-echo-info"] if args.logging else []
    names = without_faststream(names)
    options = BenchOptions(
        responders=tuple(dict.fromkeys(name.strip() for name in names)),
        in_flight=tuple(int(n) for n in args.in_flight.split(",")),
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        processes=args.processes,
        loadgens=args.loadgens,
        worker_settings=tuple(setting(text) for text in args.worker_setting),
        worker_tree=args.worker_tree.resolve() if args.worker_tree else None,
        guards=not args.no_guards,
        latencies=args.latencies,
        ids=args.ids,
        tracing_env=tuple(otel_variable(text) for text in args.tracing_env),
    )
    to_stdout = args.json is not None and str(args.json) == "-"
    try:
        result = run_bench(options)
    except BenchFailed as exc:
        # It may quote what a worker or an MCP server said: printable, as every CLI line.
        print(f"toolbus bench: {printable(str(exc))}", file=sys.stderr)
        return 1
    console = Console(stderr=to_stdout)
    if not console.is_terminal:
        console.width = TABLE_WIDTH
    render(result, console)
    for guard in result.guards:  # after the table: a line each, the failed ones marked
        console.print(printable(guard.line()), style=None if guard.ok else "bold red", markup=False)
    if args.json is not None:
        text = json.dumps(to_json(result), indent=2)
        if to_stdout:
            print(text)
        else:
            args.json.write_text(text + "\n")
    failed = any(phase.load.failures for phase in result.phases) or result.failed_guards
    return 1 if failed else 0


def without_faststream(names: list[str]) -> list[str]:
    """The responders to run, less `faststream-echo` (with a line saying so) when
    FastStream is not installed: an optional baseline (`pip install 'toolbus[bench]'`)."""
    from toolbus.cli.bench import faststream_echo

    if "faststream-echo" not in [name.strip() for name in names] or faststream_echo.available():
        return names
    print(
        "toolbus bench: faststream-echo skipped: FastStream is not installed "
        "(pip install 'faststream[mqtt]', or toolbus[bench])",
        file=sys.stderr,
    )
    return [name for name in names if name.strip() != "faststream-echo"]


def otel_variable(text: str) -> tuple[str, str]:
    """`OTEL_NAME=VALUE` for the tracing worker's environment: OTEL_* alone (the bench
    sets nothing else from outside; the config file is the worker's whole truth)."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip().startswith("OTEL_"):
        raise ValueError(f"--tracing-env takes OTEL_NAME=VALUE, not {text!r}")
    return name.strip(), value


def setting(text: str) -> tuple[str, object]:
    """`KEY=VALUE` as the config file would hold it: JSON where it parses, else text."""
    import json

    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise ValueError(f"--worker-setting takes KEY=VALUE, not {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value
