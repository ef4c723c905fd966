"""Cost of normalize + validate per call, next to one json.loads of the same payload.

Run: `make bench-normalize` (or `.venv/bin/python bench/normalize.py`). Uses the demo
server's real schema for the seed control call and the analysis-context example from
the tests; everything else (resolution, guards, validation) is the worker's own
pipeline (`Executor.prepare`), minus running the tool.
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

from rich.console import Console
from rich.table import Table

from tests.test_normalize import ANALYSIS_SCHEMA, ANALYSIS_SETTINGS, analysis_context
from toolbus.config import Settings
from toolbus.contracts import ToolResult
from toolbus.decode import Call
from toolbus.demo.server import build_server
from toolbus.execute import Outcome
from toolbus.registry import Registry, Tool
from toolbus.service import build_executor

ROUNDS = 31
CALLS_PER_ROUND = 2000


async def _unused(arguments: dict[str, Any]) -> ToolResult:
    return ToolResult()


def median_us(fn: Callable[[], object]) -> float:
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter_ns()
        for _ in range(CALLS_PER_ROUND):
            fn()
        samples.append((time.perf_counter_ns() - started) / CALLS_PER_ROUND / 1000)
    return statistics.median(samples)


def case(
    settings: Settings, name: str, schema: dict[str, Any], arguments: dict[str, Any]
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
        )
    )
    executor = build_executor(settings, registry)
    payload = json.dumps({"tool": name, "arguments": arguments}).encode()
    call = Call(id="b", tool=name, arguments=arguments, topic="bench", payload_bytes=len(payload))
    executor.prepare(call, Outcome())  # fails loudly if the case is not valid
    return median_us(lambda: executor.prepare(call, Outcome())), median_us(
        lambda: json.loads(payload)
    )


async def demo_schema() -> dict[str, Any]:
    tools = await build_server().list_tools()
    return next(dict(t.input_schema) for t in tools if t.name == "control_zwave_device")


def main() -> None:
    # Logging is measured elsewhere: here, only the pipeline's own work.
    logging.getLogger("toolbus").setLevel(logging.WARNING)
    control = case(
        Settings(),
        "control_zwave_device",
        asyncio.run(demo_schema()),
        {"device_name": "Switch One", "command": "on"},
    )
    analysis = case(ANALYSIS_SETTINGS, "analyze_code", ANALYSIS_SCHEMA, analysis_context())
    table = Table(
        title=f"normalize + validate, median of {ROUNDS} rounds x {CALLS_PER_ROUND} calls"
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
