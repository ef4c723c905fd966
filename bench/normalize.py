"""Cost of normalize + validate per call, next to one json.loads of the same payload.

Run: `make bench-normalize` (or `.venv/bin/python bench/normalize.py [--rounds N --calls N]`;
the tests run it with tiny numbers so it cannot rot). Uses the demo
server's real schema for the seed control call and the analysis-context example from
the tests; everything else (resolution, guards, validation) is the worker's own
pipeline (`Executor.prepare`), minus running the tool.
"""

from __future__ import annotations

import argparse
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

from rich.console import Console
from rich.table import Table

from tests.harness import DEMO_ARGUMENT_MAPS
from tests.normalize_cases import ANALYSIS_SCHEMA, ANALYSIS_SETTINGS, analysis_context
from toolbus.config import Settings, tool_settings
from toolbus.contracts import ToolResult
from toolbus.decode import Call
from toolbus.demo.server import build_server
from toolbus.execute import Outcome
from toolbus.registry import Registry, Tool
from toolbus.wiring import build_executor

ROUNDS = 31
CALLS_PER_ROUND = 2000


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


def case(
    settings: Settings,
    name: str,
    schema: dict[str, Any],
    arguments: dict[str, Any],
    *,
    rounds: int,
    calls: int,
) -> tuple[float, float]:
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
    executor = build_executor(settings, registry)
    payload = json.dumps({"tool": name, "arguments": arguments}).encode()
    call = Call(id="b", tool=name, arguments=arguments, topic="bench", payload_bytes=len(payload))
    executor.prepare(call, Outcome())  # fails loudly if the case is not valid
    return (
        median_us(lambda: executor.prepare(call, Outcome()), rounds, calls),
        median_us(lambda: json.loads(payload), rounds, calls),
    )


async def demo_schema() -> dict[str, Any]:
    tools = await build_server().list_tools()
    return next(dict(t.input_schema) for t in tools if t.name == "control_zwave_device")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS_PER_ROUND, help="per round")
    args = parser.parse_args()
    sizes = {"rounds": args.rounds, "calls": args.calls}
    # Logging is measured elsewhere: here, only the pipeline's own work.
    logging.getLogger("toolbus").setLevel(logging.WARNING)
    control = case(
        # The demo device map, as the bundled config sets it (product defaults map nothing).
        Settings(argument_maps=DEMO_ARGUMENT_MAPS),
        "control_zwave_device",
        asyncio.run(demo_schema()),
        {"device_name": "Switch One", "command": "on"},
        **sizes,
    )
    analysis = case(ANALYSIS_SETTINGS, "analyze_code", ANALYSIS_SCHEMA, analysis_context(), **sizes)
    table = Table(
        title=f"normalize + validate, median of {args.rounds} rounds x {args.calls} calls"
    )
    for column in ("call", "normalize + validate µs", "json.loads µs", "ratio"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for label, (pipeline, loads) in (
        ("seed control call", control),
        ("analysis context", analysis),
    ):
        table.add_row(label, f"{pipeline:.1f}", f"{loads:.2f}", f"{pipeline / loads:.1f}x")
    Console().print(table)
    print(f"target for the control call: under 50 µs -> {'met' if control[0] < 50 else 'NOT met'}")


if __name__ == "__main__":
    main()
