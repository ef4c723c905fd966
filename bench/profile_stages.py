"""Where a worker's time goes under load, per stage of a call: py-spy on `toolbus serve`.

Run: `.venv/bin/python bench/profile_stages.py [--responder toolbus-echo|toolbus-mcp]
[--seconds 8] [--raw FILE] [--worker-tree DIR] [--bench-arg ARG ...]`. It starts
`toolbus bench --only RESPONDER --in-flight 64` (its own mosquitto, paho load
generator and `toolbus serve`, as the bench always runs them), waits for the
measured window, records the worker process with `py-spy record -f raw` (200 Hz, no
idle frames) and prints the samples split into the stages of a call. `--raw FILE`
reads a recording made before (or keeps this one's with `--keep FILE`), so the split
can be re-read without a run. `--bench-arg=--tracing` (and `--only
toolbus-echo-tracing` as the responder) profiles a traced worker.

A sample belongs to the stage of its innermost frame that names one (STAGES, in
order: the first rule matching a frame wins for that frame), so a reply's JSON
encoding counts as encoding even though it runs under the pipeline. Samples in
threads other than the event loop's are split the same way and shown apart (the OTLP
exporter's thread competes with the loop for the GIL); threads blocked in a wait
(`waitpid`, a queue's `get`) are idle and left out. Shares are of the loop thread's
and other threads' busy samples together. py-spy samples wall time of running
threads: a `send` that wakes the broker on a busy machine looks larger than its CPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (stage, substrings of a frame "function (path:line)"); the first rule matching a frame wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "tracing: span export (OTLP encode, HTTP)",
        (
            "opentelemetry/exporter",
            "opentelemetry/proto",
            "google/protobuf",
            "protobuf/",
            "urllib3",
            "requests/",
            # py-spy names a namespace package's files from inside it (opentelemetry)
            "trace_encoder/",
            "trace_exporter/",
            "common/_internal/",
            "_shared_internal/",
            "transport/_requests.py",
            "http/client.py",
        ),
    ),
    (
        "tracing: spans (SDK and API)",
        (
            "opentelemetry/",
            "trace/__init__.py",
            "trace/sampling.py",
            "trace/span.py",
            "trace/propagation/",
            "context/__init__.py",
            "context/contextvars_context.py",
            "attributes/__init__.py",
            "util/instrumentation.py",
            "toolbus/observability/spans.py",
            "toolbus/observability/sampling.py",
            "toolbus/observability/propagation.py",
        ),
    ),
    ("log line", ("toolbus/observability/logs.py", "structlog/", "logging/__init__.py")),
    ("metrics", ("toolbus/observability/metrics.py",)),
    ("transport read: socket reader", ("toolbus/transport/socket_reader.py", "_sock_recv")),
    ("PUBACK bookkeeping", ("_handle_pubackcomp", "decode_puback", "toolbus/transport/pubacks.py")),
    ("transport read: property guard", ("toolbus/transport/inbound_limits.py",)),
    (
        "transport read: packet parse (paho)",
        (
            "paho/mqtt/_packet.py",
            "paho/mqtt/properties.py",
            "_packet_read",
            "_packet_handle",
            "_handle_publish",
            "_handle_on_message",
            "loop_read",
        ),
    ),
    ("transport: inbound queue", ("toolbus/transport/connection.py:3", "MqttConnection.messages")),
    (
        "socket write",
        ("toolbus/transport/socket_writer.py", "_sock_send", "loop_write", "_packet_write"),
    ),
    (
        "publish (paho packet, PUBACK future)",
        ("toolbus/worker/publisher.py", "MqttConnection.publish", "paho/mqtt/client.py"),
    ),
    (
        "decode",
        (
            "toolbus/doors/envelope/decode.py",
            "toolbus/doors/providers/",
            "toolbus/wire/untrusted.py",
            "json/decoder.py",
            "json/__init__.py",
        ),
    ),
    ("dedup claim and record", ("toolbus/dedup/",)),
    ("normalization", ("toolbus/normalization/",)),
    ("validation", ("toolbus/tools/validate.py", "jsonschema")),
    ("MCP: SDK ClientSession", ("mcp/client/", "mcp/shared/", "mcp_types/", "mcp/types")),
    ("MCP: our stdio transport and backend", ("toolbus/backends/mcp/",)),
    ("execution: local tool", ("toolbus/backends/local/",)),
    (
        "execution: executor (resolve, access, deadline)",
        ("toolbus/calls/execute.py", "toolbus/tools/"),
    ),
    (
        "reply encoding",
        (
            "toolbus/doors/envelope/outbox.py",
            "toolbus/doors/envelope/reply",
            "model_dump_json",
            "json/encoder.py",
            "orjson",
            "toolbus/wire/",
        ),
    ),
    (
        "call bookkeeping (in flight, redeliveries, rounds, context)",
        ("toolbus/calls/", "toolbus/worker/redeliveries.py", "toolbus/worker/"),
    ),
    ("pipeline", ("toolbus/doors/",)),
)
# Libraries every stage uses: a frame of theirs counts for the stage of the frame that
# called it (pydantic under the SDK's session is the session's), and for these only
# when no frame above names a stage (the event loop's own steps).
SHARED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pydantic, outside a stage", ("pydantic/", "pydantic_core")),
    ("asyncio event loop", ("asyncio/", "selectors.py")),
)
IDLE_LEAVES = (
    "_do_waitpid",
    "concurrent/futures/thread.py:8",
    "threading.py:3",
    "queue.py:1",
    "Condition.wait",
)
OTHER = "other"


def stage_of(frames: list[str]) -> str:
    """The stage of the innermost frame that matches a rule (SHARED's last)."""
    for rules in (STAGES, SHARED):
        for frame in reversed(frames):
            for stage, marks in rules:
                if any(mark in frame for mark in marks):
                    return stage
    return OTHER


def split(raw: Path) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Samples per stage: the event loop's thread, the other threads', and idle ones."""
    loop: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        n = int(count)
        in_thread = any("Thread._bootstrap" in f for f in frames)
        if in_thread and any(mark in frames[-1] for mark in IDLE_LEAVES):
            idle += n
            continue
        (threads if in_thread else loop)[stage_of(frames)] += n
    return loop, threads, idle


def report(raw: Path) -> None:
    loop, threads, idle = split(raw)
    loop_n, thread_n = sum(loop.values()), sum(threads.values())
    busy = loop_n + thread_n
    print(f"{busy} busy samples ({loop_n} event loop, {thread_n} other threads;", end=" ")
    print(f"{idle} idle thread samples left out)")
    print(f"{'stage':<62} {'loop %':>7} {'threads %':>9}")
    for stage in [s for s, _ in STAGES + SHARED] + [OTHER]:
        a, b = loop.get(stage, 0), threads.get(stage, 0)
        if a or b:
            print(f"{stage:<62} {100 * a / busy:7.1f} {100 * b / busy:9.1f}")


def worker_pid(bench: subprocess.Popen[bytes], bound_s: float) -> int:
    """The `toolbus serve` the bench started (its `python -m toolbus serve` child)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if bench.poll() is not None:
            sys.exit("the bench ended before its worker was seen")
        out = subprocess.run(
            ["pgrep", "-f", "-P", str(bench.pid), "toolbus serve"],
            capture_output=True,
            text=True,
            check=False,
        )
        pids = out.stdout.split()
        if pids:
            return int(pids[0])
        time.sleep(0.2)
    sys.exit("no `toolbus serve` under the bench")


def wait_for_loadgen(bench: subprocess.Popen[bytes], bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if bench.poll() is not None:
            sys.exit("the bench ended before its load generator started")
        out = subprocess.run(
            ["pgrep", "-P", str(bench.pid), "-f", "toolbus.cli.bench.loadgen"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.stdout.split():
            return
        time.sleep(0.2)
    sys.exit("no load generator started")


def record(args: argparse.Namespace, out: Path) -> None:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    toolbus = [sys.executable, "-m", "toolbus"]
    warmup = 3.0
    cmd = [
        *toolbus,
        "bench",
        "--only",
        args.responder,
        "--in-flight",
        "64",
        "--warmup-s",
        str(warmup),
        "--duration-s",
        str(args.seconds + 3),
        "--no-guards",  # not what is profiled (`toolbus bench` runs them first)
        *args.bench_arg,
    ]
    if args.worker_tree:
        cmd += ["--worker-tree", args.worker_tree]
    # A session of its own: on any failure here, its worker, load generator and broker
    # go with it (killing the bench alone left them running).
    bench = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        # The load generator starts once the worker answered its probes; its window opens
        # after the warm-up. The worker is found after it: the measured one by then.
        wait_for_loadgen(bench, 90.0)
        pid = worker_pid(bench, 90.0)
        time.sleep(warmup + 0.5)
        subprocess.run(
            [
                spy,
                "record",
                "-p",
                str(pid),
                "-d",
                str(args.seconds),
                "-r",
                "200",
                "-f",
                "raw",
                "-o",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        table, _ = bench.communicate(timeout=120)
        print(table.decode(errors="replace").split("\n\n")[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)  # whatever of the run is left
        bench.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responder", default="toolbus-echo")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--raw", help="read this py-spy raw recording instead of running")
    parser.add_argument("--keep", help="keep the recording here")
    parser.add_argument("--worker-tree")
    parser.add_argument("--bench-arg", action="append", default=[])
    args = parser.parse_args()
    if args.raw:
        report(Path(args.raw))
        return
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.keep) if args.keep else Path(scratch) / "profile.txt"
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        record(args, out)
        report(out)


if __name__ == "__main__":
    main()
