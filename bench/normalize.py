"""Cost of everything before a tool runs (`Executor.prepare`), next to one json.loads.

Run: `make bench-normalize` (or `.venv/bin/python bench/normalize.py [--rounds N --calls N]`;
the tests run it with tiny numbers so it cannot rot). `Executor.prepare` is resolution,
access, guards, normalization and schema validation, minus running the tool, for:

- the built-in `echo` with `{"text": "benchmark"}`: a call in its schema's shape;
- the demo server's `control_zwave_device` (its real schema) called with its own keys;
- the same with the seed's snake_case keys, mapped by the bundled argument map;
- the analysis-context example from the tests: respelled keys, lenient items, a path guard.

`--worker-tree DIR` measures DIR's `toolbus` package (e.g. `git archive` of an older commit) beside
this checkout's, each in processes of its own, alternating `--repeat` times (default 3),
and prints the median of each: a before/after pair from one run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from paired import (  # bench/paired.py: this script's folder is first on the path
    alternate,
    paired_parser,
)
from rich.console import Console
from rich.table import Table

from tests.support.harness import DEMO_ARGUMENT_MAPS
from tests.support.normalize_cases import ANALYSIS_SCHEMA, ANALYSIS_SETTINGS, analysis_context
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.calls.call import Call
from toolbus.calls.execute import Executor, Outcome
from toolbus.cli.demo.server import build_server
from toolbus.config import Settings, tool_settings
from toolbus.tools.registry import Registry, Tool
from toolbus.wire.contracts import ToolResult
from toolbus.worker.wiring import build_executor, build_registry

ROUNDS = 31
CALLS_PER_ROUND = 2000
REPEAT = 3
CHILD_TIMEOUT_S = 600
CONTROL = "control_zwave_device"
CASES = ("echo", "control call, own keys", "seed control call", "analysis context")


async def _unused(arguments: dict[str, Any]) -> ToolResult:
    return ToolResult()


def median_us(fn: Callable[[], object], rounds: int, calls: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - started) / calls / 1000)
    return statistics.median(samples)


def mcp_executor(settings: Settings, name: str, schema: dict[str, Any]) -> Executor:
    registry = Registry(settings.aliases)
    registry.register(
        Tool(
            name=name,
            description="",
            input_schema=schema,
            invoke=_unused,
            origin="mcp:bench",
            server="bench",
            rename_arguments=True,
            settings=tool_settings(settings.tools, name, "bench"),  # as McpServer resolves it
        )
    )
    return build_executor(settings, registry)


def case(
    executor: Executor, name: str, arguments: dict[str, Any], *, rounds: int, calls: int
) -> tuple[float, float]:
    """(`prepare` µs, `json.loads` µs of the same payload), medians."""
    payload = json.dumps({"tool": name, "arguments": arguments}).encode()
    call = Call(id="b", tool=name, arguments=arguments, topic="bench", payload_bytes=len(payload))
    executor.prepare(call, Outcome())  # fails loudly if the case is not valid
    return (
        median_us(lambda: executor.prepare(call, Outcome()), rounds, calls),
        median_us(lambda: json.loads(payload), rounds, calls),
    )


async def demo_schema() -> dict[str, Any]:
    tools = await build_server().list_tools()
    return next(dict(t.input_schema) for t in tools if t.name == CONTROL)


def measure(rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    # Logging is measured elsewhere: here, only the pipeline's own work.
    logging.getLogger("toolbus").setLevel(logging.WARNING)
    sizes = {"rounds": rounds, "calls": calls}
    plain = Settings()
    echo = build_executor(plain, build_registry(BUILTIN_TOOLS, plain))
    # The demo device map, as the bundled config sets it (product defaults map nothing).
    control = mcp_executor(
        Settings(argument_maps=DEMO_ARGUMENT_MAPS), CONTROL, asyncio.run(demo_schema())
    )
    analysis = mcp_executor(ANALYSIS_SETTINGS, "analyze_code", ANALYSIS_SCHEMA)
    return {
        "echo": case(echo, "echo", {"text": "benchmark"}, **sizes),
        "control call, own keys": case(
            control, CONTROL, {"deviceName": "Switch One", "action": "on"}, **sizes
        ),
        "seed control call": case(
            control, CONTROL, {"device_name": "Switch One", "command": "on"}, **sizes
        ),
        "analysis context": case(analysis, "analyze_code", analysis_context(), **sizes),
    }


def in_children(
    tree: Path, rounds: int, calls: int, repeat: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """`prepare` µs per case, `repeat` times, for `tree` and this checkout, alternating."""
    sizes = ("--rounds", str(rounds), "--calls", str(calls))
    outputs = alternate(__file__, tree, sizes, repeat=repeat, timeout_s=CHILD_TIMEOUT_S)
    before, after = ({name: [run[name][0] for run in runs] for name in CASES} for runs in outputs)
    return before, after


def main() -> None:
    parser = paired_parser(__doc__, repeat=REPEAT)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS_PER_ROUND, help="per round")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds, args.calls)))
        return
    title = f"Executor.prepare, median of {args.rounds} rounds x {args.calls} calls"
    if args.worker_tree is not None:
        theirs, ours = in_children(args.worker_tree, args.rounds, args.calls, args.repeat)
        table = Table(title=f"{title}, median of {args.repeat} processes each")
        for column in ("call", f"{args.worker_tree} µs", "this checkout µs", "ratio"):
            table.add_column(column, justify="left" if column == "call" else "right")
        for name in CASES:
            before, after = statistics.median(theirs[name]), statistics.median(ours[name])
            table.add_row(name, f"{before:.1f}", f"{after:.1f}", f"{after / before:.2f}x")
        Console().print(table)
        return
    figures = measure(args.rounds, args.calls)
    table = Table(title=title)
    for column in ("call", "prepare µs", "json.loads µs", "ratio"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for name, (prepare_us, loads_us) in figures.items():
        table.add_row(name, f"{prepare_us:.1f}", f"{loads_us:.2f}", f"{prepare_us / loads_us:.1f}x")
    Console().print(table)
    control_us = figures["seed control call"][0]
    print(f"target for the control call: under 50 µs -> {'met' if control_us < 50 else 'NOT met'}")


if __name__ == "__main__":
    main()
