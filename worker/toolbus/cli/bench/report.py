"""A bench run's figures: ratios to each baseline, the overhead targets, the table and JSON.

Every toolbus responder has a baseline measured in the same run (`Responder.baseline`):
toolbus `echo` against the bare aiomqtt echo, the toolbus MCP call against the raw SDK
session, tracing on and INFO logging against toolbus `echo` as shipped; the FastStream
echo against the bare aiomqtt echo too (toolbus `echo` / FastStream is a target). Ratios are
toolbus / baseline at the same in-flight level; the targets read them at the highest
level run (and the sequential p50 at 1 in flight).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from toolbus.cli.bench.phases import RESPONDERS, Phase
from toolbus.cli.bench.run import BenchRun


@dataclass(frozen=True, slots=True)
class Ratios:
    """One phase against its baseline's phase at the same in-flight level."""

    baseline: str
    throughput: float | None
    p50_above_ms: float
    p99: float | None
    cpu: float | None


@dataclass(frozen=True, slots=True)
class Target:
    key: str  # stable, for whoever reads the JSON
    what: str
    measured: float
    goal: str
    met: bool


def _divide(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(run: BenchRun, phase: Phase) -> Ratios | None:
    baseline = RESPONDERS[phase.responder].baseline
    found = [p for p in run.phases if p.responder == baseline and p.in_flight == phase.in_flight]
    if baseline is None or not found:
        return None
    [base] = found
    return Ratios(
        baseline=baseline,
        throughput=_divide(phase.load.throughput_rps, base.load.throughput_rps),
        p50_above_ms=round(phase.load.p50_ms - base.load.p50_ms, 3),
        p99=_divide(phase.load.p99_ms, base.load.p99_ms),
        cpu=_divide(phase.cpu_us.responder, base.cpu_us.responder),
    )


def targets(run: BenchRun) -> list[Target]:
    """The overhead targets (toolbus against its bare baselines), each one only if this
    run measured what it needs."""
    top = max(run.options.in_flight)
    at = {(p.responder, p.in_flight): p for p in run.phases}
    found: list[Target] = []

    def against(name: str, level: int) -> Ratios | None:
        phase = at.get((name, level))
        return None if phase is None else ratios(run, phase)

    def add(key: str, what: str, value: float | None, goal: float, *, at_least: bool) -> None:
        if value is not None:
            met = value >= goal if at_least else value <= goal
            found.append(Target(key, what, value, f"{'>=' if at_least else '<='} {goal:g}", met))

    if (echo := against("toolbus-echo", top)) is not None:
        add(
            "local_throughput",
            f"local req/s at {top} in flight, x aiomqtt echo",
            echo.throughput,
            0.9,
            at_least=True,
        )
    faststream = at.get(("faststream-echo", top))
    if (local := at.get(("toolbus-echo", top))) is not None and faststream is not None:
        add(
            "local_throughput_faststream",
            f"local req/s at {top} in flight, x FastStream echo",
            _divide(local.load.throughput_rps, faststream.load.throughput_rps),
            1.3,
            at_least=True,
        )
    if local is not None:
        add(
            "local_cpu_us",
            f"worker CPU per local call at {top}, us",
            local.cpu_us.responder,
            350,
            at_least=False,
        )
    if (mcp := against("toolbus-mcp", top)) is not None:
        add(
            "mcp_throughput",
            f"MCP req/s at {top} in flight, x raw SDK",
            mcp.throughput,
            0.9,
            at_least=True,
        )
    if (sequential := against("toolbus-mcp", 1)) is not None:
        add(
            "mcp_sequential_p50_above_ms",
            "MCP sequential p50 above raw SDK, ms",
            sequential.p50_above_ms,
            0.8,
            at_least=False,
        )
    if (traced := against("toolbus-echo-tracing", top)) is not None:
        add(
            "tracing_throughput",
            f"tracing on/off req/s at {top}",
            traced.throughput,
            0.9,
            at_least=True,
        )
        add("tracing_p99", f"tracing on/off p99 at {top}", traced.p99, 1.5, at_least=False)
    if (info := against("toolbus-echo-info", top)) is not None:
        add("info_throughput", f"INFO/WARNING req/s at {top}", info.throughput, 0.95, at_least=True)
    return found


def _cell(value: float | None, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def in_flight_cell(phase: Phase) -> str:
    """The requests in flight in all, and how the load generators shared them out:
    `64 (2x32)`, `16 (6+5+5)`; one load generator: `64`."""
    shares = phase.generators
    if len(shares) == 1:
        return str(phase.in_flight)
    if len(set(shares)) == 1:
        return f"{phase.in_flight} ({len(shares)}x{shares[0]})"
    return f"{phase.in_flight} ({'+'.join(map(str, shares))})"


def render(run: BenchRun, console: Console) -> None:
    options = run.options
    setup = "".join(
        (
            f", toolbus serve --processes {options.processes}" if options.processes > 1 else "",
            f", {options.loadgens} load generators" if options.loadgens > 1 else "",
            ", each request with its own id" if options.ids else "",
        )
    )
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"toolbus bench: closed loop, {options.duration_s:g} s per phase "
        f"after {options.warmup_s:g} s warm-up{setup}",
        caption="in flight: requests outstanding in all, shared out between the load "
        "generators (KxN: K processes with N each; raw-mcp is always one); "
        "x: toolbus / its baseline at the same in-flight level (toolbus-echo / "
        "aiomqtt-echo, faststream-echo / aiomqtt-echo, toolbus-mcp / raw-mcp, tracing and "
        "INFO / toolbus-echo); "
        "dp50: ms of p50 above the baseline's; CPU us per call from /proc (responder's "
        "process tree, broker, load generators summed)",
    )
    columns = "responder|in flight|req/s|x|p50 ms|dp50|p99 ms|CPU us/call|x|broker|loadgen|fail"
    for column in columns.split("|"):
        table.add_column(column, justify="left" if column == "responder" else "right")
    for phase in run.phases:
        r = ratios(run, phase)
        load, cpu = phase.load, phase.cpu_us
        table.add_row(
            phase.responder,
            in_flight_cell(phase),
            f"{load.throughput_rps:.0f}",
            _cell(r.throughput if r else None, 2, "x"),
            f"{load.p50_ms:.2f}",
            _cell(r.p50_above_ms if r else None, 2),
            f"{load.p99_ms:.2f}",
            _cell(cpu.responder, 0),
            _cell(r.cpu if r else None, 2, "x"),
            _cell(cpu.broker, 0),
            _cell(cpu.loadgen, 0),
            str(load.failures),
        )
    console.print(table)
    if found := targets(run):
        goals = Table(
            box=box.SIMPLE_HEAD,
            title="targets: what toolbus adds to its bare baselines",
            caption="x: toolbus / its baseline, as in the table above",
        )
        for column in ("target", "measured", "goal", "met"):
            goals.add_column(column, justify="left" if column == "target" else "right")
        for t in found:
            goals.add_row(t.what, f"{t.measured:.2f}", t.goal, "yes" if t.met else "no")
        console.print(goals)


def to_json(run: BenchRun) -> dict[str, Any]:
    options = run.options
    phases = []
    for phase in run.phases:
        r = ratios(run, phase)
        phases.append(
            {
                "responder": phase.responder,
                "in_flight": phase.in_flight,
                "loadgens_in_flight": list(phase.generators),
                **asdict(phase.load),
                "cpu_us_per_call": asdict(phase.cpu_us),
                "ratios": None if r is None else asdict(r),
            }
        )
        if options.latencies:
            phases[-1]["latencies_ms"] = list(phase.latencies_ms)
    return {
        "parameters": {
            "responders": list(options.responders),
            "in_flight": list(options.in_flight),
            "duration_s": options.duration_s,
            "warmup_s": options.warmup_s,
            "processes": options.processes,
            "loadgens": options.loadgens,
            "worker_settings": {k: _no_login(v) for k, v in options.worker_settings},
            # Never an exporter's headers: they carry a collector's token.
            "tracing_env": {k: v for k, v in options.tracing_env if not k.endswith("_HEADERS")},
            "worker_tree": str(options.worker_tree) if options.worker_tree else None,
            "guards": options.guards,
            "ids": options.ids,
        },
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": git_commit(options.worker_tree or Path(__file__).resolve().parents[4]),
        "traces_exported": run.traces_exported,
        "guards": [asdict(guard) for guard in run.guards],  # [] with --no-guards
        "phases": phases,
        "targets": [asdict(t) for t in targets(run)],
    }


def git_commit(tree: Path) -> str | None:
    """The checkout's commit, `+dirty` when tracked files changed; None outside git."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(  # noqa: S603 -- fixed git arguments
                ["git", "-C", str(tree), *args],  # noqa: S607 -- git from PATH, as a user runs it
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


_LOGIN = re.compile(r"(?<=://)[^/@\s]*@")


def _no_login(value: object) -> object:
    """A setting as a report may show it: a URL's user and password left out (reports
    are shared and committed; `dedup_store=redis://:pw@…` is a setting like another)."""
    return _LOGIN.sub("", value) if isinstance(value, str) else value
