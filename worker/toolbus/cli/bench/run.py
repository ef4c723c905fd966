"""A bench run: one private broker, each responder started in turn, a phase per in-flight level.

Responders run one at a time, each in a process of its own started for its phases and
stopped after them, so no two compete for the machine; toolbus `echo` and the MCP call
share one `toolbus serve` (the same worker a user runs), tracing and INFO logging each
get a fresh one. The OTLP sink runs (in a thread) when a responder traces. A rich
progress bar on stderr names the phase running; it disappears when the run ends.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolbus.cli.bench import aiomqtt_echo, faststream_echo
from toolbus.cli.bench.guard_run import run_guards
from toolbus.cli.bench.guards import GuardResult
from toolbus.cli.bench.mosquitto import Broker, private_broker
from toolbus.cli.bench.phases import (
    MCP_TOOL,
    RESPONDERS,
    Measured,
    Phase,
    Responder,
    lines,
    loadgen_commands,
    run_phase,
    script,
    split,
)
from toolbus.cli.bench.served import Probe, ServeOptions, served_worker, stop
from toolbus.cli.bench.span_sink import SpanSink, span_sink

ECHO_START_BOUND_S = 30.0


class BenchFailed(Exception):
    """The run could not measure what it set out to (its figures would mislead)."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What to run: responders by name (see `phases.RESPONDERS`), in-flight levels,
    seconds of warm-up and of measurement per phase, how the worker runs, and how many
    load-generator processes share each level's requests in flight."""

    responders: tuple[str, ...]
    in_flight: tuple[int, ...] = (1, 16, 64)
    duration_s: float = 3.0
    warmup_s: float = 1.0
    processes: int = 1
    worker_tree: Path | None = None
    loadgens: int = 1
    worker_settings: tuple[tuple[str, object], ...] = ()  # into the workers' config
    guards: bool = True  # the guards step (guard_run.py); off only by `--no-guards`
    latencies: bool = False  # every phase's latencies in the JSON (`--latencies`)
    ids: bool = False  # each request with an id of its own (`--ids`): dedup measured
    tracing_env: tuple[tuple[str, str], ...] = ()  # OTEL_* of the tracing worker (a sampler)

    def __post_init__(self) -> None:
        unknown = [name for name in self.responders if name not in RESPONDERS]
        if unknown or not self.responders:
            known = ", ".join(RESPONDERS)
            raise ValueError(f"unknown responder {', '.join(unknown) or '(none)'}; known: {known}")
        if not self.in_flight or min(self.in_flight) < 1:
            raise ValueError("in-flight levels are whole numbers of at least 1")
        if self.duration_s <= 0 or self.warmup_s < 0 or self.processes < 1:
            raise ValueError("the duration is above 0, the warm-up at least 0, processes >= 1")
        if self.loadgens < 1:
            raise ValueError("load generators: at least 1")


@dataclass(slots=True)
class BenchRun:
    options: BenchOptions
    phases: list[Phase] = field(default_factory=list)
    traces_exported: int | None = None  # span exports the sink received, when tracing
    guards: list[GuardResult] = field(default_factory=list)  # empty: not run (`--no-guards`)

    @property
    def failed_guards(self) -> list[GuardResult]:
        return [guard for guard in self.guards if not guard.ok]


def run(options: BenchOptions, *, show_progress: bool = True) -> BenchRun:
    result = BenchRun(options)
    responders = [RESPONDERS[name] for name in options.responders]
    window = (options.warmup_s, options.duration_s)
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolbus-bench-")))
        broker = stack.enter_context(private_broker())
        sink = stack.enter_context(span_sink()) if any(r.tracing for r in responders) else None
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=not show_progress,
        )
        stack.enter_context(progress)
        task = progress.add_task("starting", total=len(responders) * len(options.in_flight))
        if options.guards:
            progress.update(task, description="guards: what the fast paths must keep")
            result.guards = _guards(scratch, broker, options)
        for _, sharing in itertools.groupby(responders, key=lambda r: r.host):
            group = list(sharing)
            progress.update(task, description=f"{group[0].name}: starting")
            with started(group[0], broker, scratch, options, sink) as (measured, prefix):
                for responder, n in itertools.product(group, options.in_flight):
                    progress.update(task, description=f"{responder.name}, {n} in flight")
                    shares = split(n, options.loadgens, responder)
                    commands = loadgen_commands(
                        broker.url, prefix, responder, shares, ids=options.ids
                    )
                    phase = run_phase(responder.name, shares, commands, measured, window)
                    result.phases.append(phase)
                    progress.advance(task)
        if sink is not None:
            result.traces_exported = sink.traces_received
    if result.traces_exported == 0:
        raise BenchFailed("no span reached the local OTLP receiver: tracing was not on")
    return result


def _guards(scratch: Path, broker: Broker, options: BenchOptions) -> list[GuardResult]:
    """The guards step on a worker of its own, run as the measured ones are."""
    serve = ServeOptions(
        processes=options.processes,
        worker_tree=options.worker_tree,
        settings=options.worker_settings,
    )
    # The memory store remembers ids per process: a repeat on another one is not a repeat.
    per_process = dict(options.worker_settings).get("dedup_store", "memory") == "memory"
    try:
        return run_guards(
            scratch, broker.url, serve, dedup_counted=not (per_process and options.processes > 1)
        )
    except RuntimeError as exc:  # the guard worker never got ready: its log says why
        raise BenchFailed(f"guards: {exc}") from exc


@contextmanager
def started(
    responder: Responder,
    broker: Broker,
    scratch: Path,
    options: BenchOptions,
    sink: SpanSink | None,
) -> Iterator[tuple[Measured, str]]:
    """The responder running (the raw baseline starts with each load generator), with
    whose CPU to read and the topic prefix it serves."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    if responder.kind == "raw":
        yield Measured(None, None), prefix
    elif responder.kind in ("aiomqtt", "faststream"):
        echo = aiomqtt_echo if responder.kind == "aiomqtt" else faststream_echo
        with _echo(echo, broker.url, f"{prefix}/call/echo") as pid:
            yield Measured(pid, broker.pid), prefix
    else:
        serve = ServeOptions(
            log_level=responder.log_level,
            processes=options.processes,
            worker_tree=options.worker_tree,
            settings=options.worker_settings,
            otlp_endpoint=sink.endpoint if responder.tracing and sink is not None else None,
            tracing_env=options.tracing_env if responder.tracing else (),
        )
        probes = [
            Probe(f"{prefix}/call/{tool}", json.dumps({"arguments": arguments}).encode())
            for tool, arguments in (
                ("echo", RESPONDERS["toolbus-echo"].arguments),
                (MCP_TOOL, RESPONDERS["toolbus-mcp"].arguments),
            )
        ]
        with served_worker(scratch, broker.url, prefix, serve, probes) as proc:
            yield Measured(proc.pid, broker.pid), prefix


@contextmanager
def _echo(module: ModuleType, broker_url: str, topic: str) -> Iterator[int]:
    """A bare echo responder (`aiomqtt_echo`, `faststream_echo`) until it says `ready`."""
    proc = subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
        [*script(module), "--broker", broker_url, "--topic", topic],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    try:
        for line in lines(proc, time.monotonic() + ECHO_START_BOUND_S):
            if line == module.READY:
                break
        else:
            raise BenchFailed(f"the echo responder {module.__name__} exited with {proc.wait()}")
        yield proc.pid
    finally:
        stop(proc)
