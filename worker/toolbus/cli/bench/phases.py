"""One phase: a responder under closed-loop load at one in-flight level, and its figures.

The responders, each its own process (the catalogue is `RESPONDERS`): the bare aiomqtt
echo, `toolbus serve` answering its built-in `echo` or the demo MCP server's
`control_zwave_device` (snake_case keys, which normalization maps to the schema's
camelCase), the raw mcp SDK on one session calling the same tool with the schema's own
keys, and `toolbus serve` echoing with tracing on or logging at INFO.

Load generators: a phase runs K of them at once (`--loadgens K`), its in-flight level
shared out between them (`split`: 64 over 2 is 32 + 32, so "in flight" stays what the
responder has outstanding), each on its own reply topic. The bench holds their window:
once every one has said `started` it waits the warm-up, then writes a line to each
one's stdin to open the window and, after the measured seconds, another to close it.
Their figures are merged (`loadgen.merged`): rates and counts summed, percentiles of
all their latencies together. The raw baseline is always one process: one session.

CPU per call: each load generator prints `window open` and `window closed`; once all
have, the bench reads the CPU time of the responder's process tree (found once before
the phase), of the broker and of the load generators (summed). CPU seconds in the
window divided by the calls the window held (the merged rate times the time between
the two readings, the window's length give or take reading a pipe) is CPU per call.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from toolbus.cli.bench import cpu, loadgen
from toolbus.cli.bench.loadgen import (
    DRAIN_BOUND_S,
    STARTED,
    WINDOW_CLOSED,
    WINDOW_OPEN,
    LoadFigures,
    merged,
)

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
EDGE_BOUND_S = 10.0  # from the bench's line on stdin to a load generator's window line


@dataclass(frozen=True, slots=True)
class Responder:
    """What answers, what it is compared against, and how it runs."""

    name: str
    kind: str  # "aiomqtt", "faststream", "toolbus" or "raw"
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
        Responder("faststream-echo", "faststream", "echo", baseline="aiomqtt-echo"),
        Responder("toolbus-echo", "toolbus", "echo", baseline="aiomqtt-echo"),
        Responder("toolbus-mcp", "toolbus", MCP_TOOL, baseline="raw-mcp"),
        Responder("raw-mcp", "raw", MCP_TOOL),
        Responder("toolbus-echo-tracing", "toolbus", "echo", "toolbus-echo", tracing=True),
        Responder("toolbus-echo-info", "toolbus", "echo", "toolbus-echo", log_level="INFO"),
    )
}
DEFAULT_RESPONDERS = ("aiomqtt-echo", "faststream-echo", "toolbus-echo", "toolbus-mcp", "raw-mcp")


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
    in_flight: int  # in all: the sum of `split`
    load: LoadFigures
    cpu_us: CpuPerCall
    split: tuple[int, ...] = ()  # each load generator's in-flight level; () read as one
    # Every latency in the window, ms, in the order the replies came (load generators'
    # one after another): the JSON's `latencies_ms` with `--latencies`.
    latencies_ms: tuple[float, ...] = ()

    @property
    def generators(self) -> tuple[int, ...]:
        return self.split or (self.in_flight,)


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


def split(in_flight: int, loadgens: int, responder: Responder) -> tuple[int, ...]:
    """Each load generator's share of `in_flight`, as even as it goes (16 over 3 is
    6 + 5 + 5); a level below `loadgens` runs on fewer (1 in flight on one), and the
    raw baseline, its own single session, on one."""
    count = 1 if responder.kind == "raw" else max(1, min(loadgens, in_flight))
    each, more = divmod(in_flight, count)
    return tuple(each + (i < more) for i in range(count))


def run_phase(
    responder: str,
    shares: tuple[int, ...],
    commands: list[list[str]],
    measured: Measured,
    window: tuple[float, float],
) -> Phase:
    """Runs the load generators to their merged figures, opening and closing their
    window together (`window`: seconds of warm-up, then measured) and reading CPU
    at its edges."""
    own = measured.responder_root is None
    tree = set() if measured.responder_root is None else cpu.tree(measured.responder_root)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            procs.append(
                subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
                    command, stdout=subprocess.PIPE, stdin=subprocess.PIPE, bufsize=0
                )
            )
        started_by = time.monotonic() + START_BOUND_S
        for proc in procs:
            _expect(responder, proc, STARTED, started_by)
        if own:
            tree = cpu.tree(procs[0].pid)  # the raw client and the server it started
        broker = set() if measured.broker is None else {measured.broker}
        loadgens = set() if own else {proc.pid for proc in procs}
        readings: list[tuple[float, cpu.Reading, cpu.Reading, cpu.Reading]] = []
        time.sleep(window[0])  # the warm-up: load runs, nothing is counted
        for edge, then in ((WINDOW_OPEN, window[1]), (WINDOW_CLOSED, 0.0)):
            for proc in procs:
                _go(proc)
            for proc in procs:
                _expect(responder, proc, edge, time.monotonic() + EDGE_BOUND_S)
            readings.append(
                (time.perf_counter(), cpu.read(tree), cpu.read(broker), cpu.read(loadgens))
            )
            time.sleep(then)  # the measured window, when it has just opened
        drained_by = time.monotonic() + DRAIN_BOUND_S + EDGE_BOUND_S
        parts = [_figures(responder, proc, drained_by) for proc in procs]
        load = merged(parts)
    finally:
        for proc in procs:
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
        sum(shares),
        load,
        CpuPerCall(
            per_call(r1, r0, True), per_call(b1, b0, bool(broker)), per_call(g1, g0, bool(loadgens))
        ),
        shares,
        tuple(ms for _, samples in parts for ms in samples),
    )


def _go(proc: subprocess.Popen[bytes]) -> None:
    """The line that opens or closes a load generator's window (`--window-on-stdin`)."""
    assert proc.stdin is not None
    with contextlib.suppress(OSError):  # it has ended: `_expect` says so, with what it printed
        proc.stdin.write(b"\n")


def _expect(responder: str, proc: subprocess.Popen[bytes], marker: str, deadline: float) -> None:
    """Reads the load generator's lines up to `marker`; RuntimeError if it ends or
    reports an error first, TimeoutError past `deadline`."""
    for line in lines(proc, deadline):
        if line == marker:
            return
        if line.startswith("{") and "error" in (body := json.loads(line)):
            raise RuntimeError(f"{responder}: the load generator failed: {body['error']}")
    raise RuntimeError(f"{responder}: the load generator ended before {marker!r}")


def _figures(
    responder: str, proc: subprocess.Popen[bytes], deadline: float
) -> tuple[LoadFigures, list[float]]:
    """What a load generator printed last, once it has ended (its figures are one line,
    with every latency: read in one go, not line by line)."""
    out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    found = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    body = json.loads(found[-1]) if found else {}
    if "error" in body:
        raise RuntimeError(f"{responder}: the load generator failed: {body['error']}")
    if proc.returncode != 0 or "latencies_ms" not in body:
        raise RuntimeError(f"{responder}: the load generator ended without figures")
    samples = body.pop("latencies_ms")
    return LoadFigures(**body), samples


def loadgen_commands(
    broker_url: str,
    prefix: str,
    responder: Responder,
    shares: tuple[int, ...],
    *,
    ids: bool = False,
) -> list[list[str]]:
    """A command per load generator, each with its share of the requests in flight and
    a reply topic of its own; the window is the bench's (`run_phase`). `ids`: each
    request with an id of its own (`--ids`), so a toolbus worker claims and records it."""
    paced = ["--window-on-stdin", "--samples"]
    if responder.kind == "raw":
        [in_flight] = shares
        return [
            [
                sys.executable,
                "-m",
                "toolbus.cli.bench.raw_mcp",
                "--tool",
                responder.tool,
                "--arguments",
                json.dumps(responder.arguments),
                "--in-flight",
                str(in_flight),
                *paced,
            ]
        ]
    return [
        [
            *script(loadgen),
            "--broker",
            broker_url,
            "--topic",
            f"{prefix}/call/{responder.tool}",
            "--payload",
            json.dumps({"arguments": responder.arguments}),
            "--reply-topic",
            f"{prefix}/reply/loadgen-{sum(shares)}-{number}",
            "--in-flight",
            str(in_flight),
            *paced,
            *(["--ids"] if ids else []),
        ]
        for number, in_flight in enumerate(shares, start=1)
    ]


def script(module: ModuleType) -> list[str]:
    """Runs a module by its path, not `-m toolbus...`: importing the `toolbus` package
    would cost each load generator half a second it does not need (-P: its folder is
    not put first on sys.path, where `toolbus.cli.bench`'s modules would shadow others)."""
    assert module.__file__ is not None
    return [sys.executable, "-P", module.__file__]
