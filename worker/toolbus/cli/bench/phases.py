"""One phase: a responder under closed-loop load at one in-flight level, and its figures.

The responders, each its own process (the catalogue is `RESPONDERS`): the bare aiomqtt
echo, `toolbus serve` answering its built-in `echo` or the demo MCP server's
`control_zwave_device` (snake_case keys, which normalization maps to the schema's
camelCase), the raw mcp SDK on one session calling the same tool with the schema's own
keys, and `toolbus serve` echoing with tracing on or logging at INFO.

CPU per call: the load generator prints `window open` and `window closed`; at each
line the bench reads the CPU time of the responder's process tree (found once before
the phase), of the broker and of the load generator. CPU seconds in the window divided
by the calls the window held (the measured rate times the time between the two
readings, which is the window's length give or take reading a pipe) is CPU per call.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from toolbus.cli.bench import cpu, loadgen
from toolbus.cli.bench.loadgen import DRAIN_BOUND_S, WINDOW_CLOSED, WINDOW_OPEN, LoadFigures

MCP_TOOL = "control_zwave_device"
ECHO_ARGUMENTS: dict[str, object] = {"text": "benchmark"}
MCP_ARGUMENTS: dict[str, object] = {
    "device_name": "Switch One",
    "action": "on",
}  # what an AI client sends
RAW_MCP_ARGUMENTS: dict[str, object] = {
    "deviceName": "Switch One",
    "action": "on",
}  # the schema's own keys
START_BOUND_S = 60.0  # a load generator's start-up (the raw baseline starts its server)


@dataclass(frozen=True, slots=True)
class Responder:
    """What answers, what it is compared against, and how it runs."""

    name: str
    kind: str  # "aiomqtt", "toolbus" or "raw"
    tool: str
    baseline: str | None = None  # the responder its ratios divide by
    log_level: str = "WARNING"
    tracing: bool = False

    @property
    def host(self) -> tuple[str, ...]:
        """Responders with the same host share one process: toolbus `echo` and the MCP
        call run on one `toolbus serve` (a baseline runs alone)."""
        if self.kind != "toolbus":
            return (self.name,)
        return (self.kind, self.log_level, str(self.tracing))

    @property
    def arguments(self) -> dict[str, object]:
        if self.tool != MCP_TOOL:
            return ECHO_ARGUMENTS
        return RAW_MCP_ARGUMENTS if self.kind == "raw" else MCP_ARGUMENTS


RESPONDERS = {
    r.name: r
    for r in (
        Responder("aiomqtt-echo", "aiomqtt", "echo"),
        Responder("toolbus-echo", "toolbus", "echo", baseline="aiomqtt-echo"),
        Responder("toolbus-mcp", "toolbus", MCP_TOOL, baseline="raw-mcp"),
        Responder("raw-mcp", "raw", MCP_TOOL),
        Responder("toolbus-echo-tracing", "toolbus", "echo", "toolbus-echo", tracing=True),
        Responder("toolbus-echo-info", "toolbus", "echo", "toolbus-echo", log_level="INFO"),
    )
}
DEFAULT_RESPONDERS = ("aiomqtt-echo", "toolbus-echo", "toolbus-mcp", "raw-mcp")


@dataclass(frozen=True, slots=True)
class CpuPerCall:
    """Microseconds of CPU per completed call, by whom; None where there is no such
    process (the raw baseline has neither broker nor separate load generator)."""

    responder: float | None
    broker: float | None
    loadgen: float | None


@dataclass(frozen=True, slots=True)
class Phase:
    responder: str
    in_flight: int
    load: LoadFigures
    cpu_us: CpuPerCall


@dataclass(frozen=True, slots=True)
class Measured:
    """Whose CPU a phase reads: the responder's process tree (None: the load generator
    is the responder, as the raw baseline is) and the broker (None: there is none)."""

    responder_root: int | None
    broker: int | None


def lines(proc: subprocess.Popen[bytes], deadline: float) -> Iterator[str]:
    """The process's stdout, line by line, until it ends; TimeoutError past `deadline`.
    (Its stdout must be unbuffered on our side: a select cannot see a Python buffer.)"""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError(f"{command_name(proc)} wrote no line in time")
            line = proc.stdout.readline()
            if not line:
                return
            yield line.decode(errors="replace").rstrip("\n")


def command_name(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    return " ".join(map(str, args[:3])) if isinstance(args, list) else str(args)


def run_phase(
    responder: str, in_flight: int, command: list[str], measured: Measured, window_s: float
) -> Phase:
    """Runs one load generator to its figures, reading CPU at its window's edges."""
    own = measured.responder_root is None
    tree = set() if measured.responder_root is None else cpu.tree(measured.responder_root)
    proc = subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
        command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, bufsize=0
    )
    try:
        broker = set() if measured.broker is None else {measured.broker}
        loadgen = set() if own else {proc.pid}
        readings: list[tuple[float, cpu.Reading, cpu.Reading, cpu.Reading]] = []
        load: LoadFigures | None = None
        deadline = time.monotonic() + START_BOUND_S + window_s + DRAIN_BOUND_S
        for line in lines(proc, deadline):
            if line in (WINDOW_OPEN, WINDOW_CLOSED):
                if own and line == WINDOW_OPEN:
                    tree = cpu.tree(proc.pid)  # the raw client and the server it started
                readings.append(
                    (time.perf_counter(), cpu.read(tree), cpu.read(broker), cpu.read(loadgen))
                )
            elif line.startswith("{"):
                body = json.loads(line)
                if "error" in body:
                    raise RuntimeError(f"{responder}: the load generator failed: {body['error']}")
                load = LoadFigures(**body)
        if proc.wait(timeout=DRAIN_BOUND_S) != 0 or load is None or len(readings) != 2:
            raise RuntimeError(f"{responder}: the load generator ended without figures")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (t0, r0, b0, g0), (t1, r1, b1, g1) = readings
    calls = load.throughput_rps * (t1 - t0)

    def per_call(after: cpu.Reading, before: cpu.Reading, present: bool) -> float | None:
        if not present or calls <= 0:
            return None
        return round(after.seconds_since(before) / calls * 1e6, 1)

    return Phase(
        responder,
        in_flight,
        load,
        CpuPerCall(
            per_call(r1, r0, True), per_call(b1, b0, bool(broker)), per_call(g1, g0, bool(loadgen))
        ),
    )


def loadgen_command(
    broker_url: str,
    prefix: str,
    responder: Responder,
    in_flight: int,
    *,
    warmup_s: float,
    duration_s: float,
) -> list[str]:
    if responder.kind == "raw":
        return [
            sys.executable,
            "-m",
            "toolbus.cli.bench.raw_mcp",
            "--tool",
            responder.tool,
            "--arguments",
            json.dumps(responder.arguments),
            *_loop_flags(in_flight, warmup_s, duration_s),
        ]
    return [
        *script(loadgen),
        "--broker",
        broker_url,
        "--topic",
        f"{prefix}/call/{responder.tool}",
        "--payload",
        json.dumps({"arguments": responder.arguments}),
        "--reply-topic",
        f"{prefix}/reply/loadgen-{in_flight}",
        *_loop_flags(in_flight, warmup_s, duration_s),
    ]


def script(module: ModuleType) -> list[str]:
    """Runs a module by its path, not `-m toolbus...`: importing the `toolbus` package
    would cost each load generator half a second it does not need (-P: its folder is
    not put first on sys.path, where `toolbus.cli.bench`'s modules would shadow others)."""
    assert module.__file__ is not None
    return [sys.executable, "-P", module.__file__]


def _loop_flags(in_flight: int, warmup_s: float, duration_s: float) -> list[str]:
    return [
        "--in-flight",
        str(in_flight),
        "--warmup-s",
        str(warmup_s),
        "--duration-s",
        str(duration_s),
    ]
