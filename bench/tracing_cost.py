"""What tracing costs a call, in-process: echo calls through `Pipeline.handle` with the
worker's own tracing set-up (`configure_tracing`: the SDK's `TracerProvider`, the
`BatchSpanProcessor`, the OTLP/HTTP exporter) posting to a sink in another process.

Run: `.venv/bin/python bench/tracing_cost.py [--rounds N --calls N] [--profile PATH]`.
Each round hands `--calls` echo messages to the pipeline, then flushes the batch
processor, so the round's export (protobuf encoding and the HTTP post, in the
processor's thread) is inside it. Figures are CPU µs per call, fastest round: `process`
(every thread of the process, the flush included, `time.process_time`), `loop` (the
event loop's thread while it handles the calls, `time.thread_time`) and `export` (the
rest: the processor's thread, and the flush's last export). First
without tracing (no SDK), then with it: the SDK is process-wide and installed once.
`OTEL_*` variables set for the run (a sampler, `OTEL_BSP_*`) apply, as for `toolbus serve`.

`--profile PATH` writes cProfile's statistics of the traced rounds' loop thread (the
processor's thread is not profiled: its encode is timed on its own, `encode` µs per
call, the spans of one call encoded as the exporter does in batches of 512).

`--worker-tree DIR` measures DIR's `toolbus` package beside this checkout's, each in
processes of their own, alternating `--repeat` times (default 3): medians of each.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from paired import alternate, paired_parser, print_paired  # bench/paired.py, beside this script
from rich.console import Console
from rich.table import Table

from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.config import Settings
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.observability.metrics import Metrics
from toolbus.observability.sdk import configure_tracing
from toolbus.wire.messages import Inbound, Outbound
from toolbus.worker.wiring import build_executor, build_registry, topics_for

ROUNDS = 10
CALLS_PER_ROUND = 1000
REPEAT = 3
CHILD_TIMEOUT_S = 600
ENCODE_BATCH = 512  # the batch processor's default batch

# The sink: a process of its own, so its CPU is not the worker's.
SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class Discard:
    """A publisher that drops what it is given: only the worker's side is measured."""

    async def publish(self, out: Outbound) -> None:
        return None


def pipeline() -> Pipeline:
    settings = Settings.model_validate({"topic_prefix": "tb"})
    executor = build_executor(settings, build_registry(BUILTIN_TOOLS, settings), metrics=Metrics())
    return Pipeline(
        executor,
        topics_for(settings),
        Discard(),
        worker_id="bench",
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
    )


def message(n: int) -> Inbound:
    return Inbound(
        topic="tb/call/echo",
        payload=json.dumps({"id": f"c{n}", "arguments": {"text": "hi"}}).encode(),
        response_topic="tb/reply/bench",
        correlation_data=b"c",
    )


async def rounds_of(
    flush: Any, rounds: int, calls: int, profile: cProfile.Profile | None
) -> dict[str, float]:
    best = {"process": float("inf"), "loop": float("inf")}
    export_of_best = 0.0
    async with pipeline() as handling:
        for r in range(rounds):
            messages = [message(r * calls + i) for i in range(calls)]
            flush()  # nothing of the round before is left to export
            process, loop = time.process_time(), time.thread_time()
            if profile is not None:
                profile.enable()
            for each in messages:
                await handling.handle(each)
            if profile is not None:
                profile.disable()
            loop_us = (time.thread_time() - loop) / calls * 1e6  # the calls, not the flush
            flush()
            process_us = (time.process_time() - process) / calls * 1e6
            if process_us < best["process"]:
                best["process"], export_of_best = process_us, process_us - loop_us
            best["loop"] = min(best["loop"], loop_us)
    return best | {"export": export_of_best}


def encode_us_per_call(spans: list[Any]) -> float:
    """The exporter's encoding of one call's spans, in batches as the processor sends."""
    per_call = max(1, len(spans))
    batch = (spans * (ENCODE_BATCH // per_call + 1))[:ENCODE_BATCH]
    fastest = float("inf")
    for _ in range(20):
        started = time.process_time()
        encode_spans(batch).SerializePartialToString()
        fastest = min(fastest, time.process_time() - started)
    return fastest / ENCODE_BATCH * per_call * 1e6


class Last(SpanProcessor):
    """Keeps the last call's spans (three), for `encode_us_per_call`."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans = [*self.spans[-2:], span]


def measure(rounds: int, calls: int, profile_path: str | None) -> dict[str, float]:
    logging.getLogger("toolbus").setLevel(logging.WARNING)  # the call line is measured elsewhere
    off = asyncio.run(rounds_of(lambda: None, rounds, calls, None))
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        port = sink.stdout.readline().strip()
        # Into the process's environment: the exporter reads its endpoint there.
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        os.environ["OTEL_TRACES_EXPORTER"] = "otlp"
        provider = configure_tracing()
        assert provider is not None

        last = Last()
        provider.add_span_processor(last)
        # CPU time of this thread: wall time would count the waits for the GIL the
        # processor's thread holds against whatever function waited.
        profile = cProfile.Profile() if profile_path else None
        on = asyncio.run(rounds_of(provider.force_flush, rounds, calls, profile))
        if profile is not None and profile_path:
            profile.dump_stats(profile_path)
        encode = encode_us_per_call(last.spans)
        provider.shutdown()
    finally:
        sink.terminate()
        sink.wait(10)
    figures = {f"off {k}": v for k, v in off.items() if k != "export"}
    figures |= {f"on {k}": v for k, v in on.items()}
    figures["on encode"] = encode
    return figures


def main() -> None:
    parser = paired_parser(__doc__, repeat=REPEAT)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS_PER_ROUND, help="per round")
    parser.add_argument("--profile", metavar="PATH", help="cProfile of the traced loop thread")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds, args.calls, None)))
        return
    title = f"echo through Pipeline.handle, CPU µs a call, fastest of {args.rounds} x {args.calls}"
    if args.worker_tree is None:
        figures = measure(args.rounds, args.calls, args.profile)
        table = Table(title=title)
        table.add_column("figure")
        table.add_column("µs", justify="right")
        for name, figure in figures.items():
            table.add_row(name, f"{figure:.1f}")
        ratio = figures["on process"] / figures["off process"]
        table.add_row("on / off (process)", f"{ratio:.2f}x")
        Console().print(table)
        return
    sizes = ("--rounds", str(args.rounds), "--calls", str(args.calls))
    outputs = alternate(
        __file__, args.worker_tree, sizes, repeat=args.repeat, timeout_s=CHILD_TIMEOUT_S
    )
    names = list(outputs[1][0])
    print_paired(title, "figure", names, outputs, tree=args.worker_tree, repeat=args.repeat)


if __name__ == "__main__":
    main()
