"""Cost of the per-call log line: `log_call` through the handler `setup_logging` installs.

Run: `.venv/bin/python bench/log_line.py [--lines N --rounds N]`. Each format (`json`,
`text`) writes N call lines (the built-in `echo` with one argument, inside a recording
span so the line carries a trace id, as a traced worker's does) to /dev/null; the figure
is the fastest round's µs per line (on a shared machine the least disturbed one),
everything included: building the record, the trace-id lookup, formatting and the write.

`--worker-tree DIR` measures DIR's `toolbus` package (e.g. `git archive` of an older commit)
beside this checkout's, each in processes of its own, alternating `--repeat` times
(default 3), and prints the median of each: a before/after pair from one run.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

# A child of `--worker-tree` imports the older `toolbus` first, through PYTHONPATH.
from paired import (  # bench/paired.py: this script's folder is first on the path
    alternate,
    paired_parser,
)

from toolbus.calls.call import Call
from toolbus.calls.call_log import log_call
from toolbus.observability.logs import setup_logging

FORMATS = ("json", "text")
LINES = 2_000
ROUNDS = 20
REPEAT = 3
CHILD_TIMEOUT_S = 300


def measure(lines: int, rounds: int) -> dict[str, float]:
    """µs per call line, per format: the fastest of `rounds` rounds of `lines` lines."""
    tracer = TracerProvider().get_tracer("bench")
    call = Call(id="c-0123456789", tool="echo", arguments={"text": "benchmark"}, topic="tb/call")
    figures: dict[str, float] = {}
    with open(os.devnull, "w") as sink:
        for fmt in FORMATS:
            sys.stderr, saved = sink, sys.stderr  # the handler writes to stderr as set up
            try:
                setup_logging("INFO", fmt)
            finally:
                sys.stderr = saved
            per_round: list[float] = []
            with tracer.start_as_current_span("call"):
                for _ in range(rounds):
                    started = time.perf_counter()
                    for _ in range(lines):
                        log_call(
                            call,
                            call.arguments,
                            tool="echo",
                            outcome="ok",
                            duration_ms=0.42,
                            slow_call_ms=1000.0,
                            log_arguments=False,
                        )
                    per_round.append((time.perf_counter() - started) / lines * 1e6)
            figures[fmt] = min(per_round)
    logging.getLogger().handlers.clear()
    return figures


def in_children(
    tree: Path, lines: int, rounds: int, repeat: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """µs per line per format, `repeat` times, for `tree` and this checkout, alternating."""
    sizes = ("--lines", str(lines), "--rounds", str(rounds))
    outputs = alternate(__file__, tree, sizes, repeat=repeat, timeout_s=CHILD_TIMEOUT_S)
    before, after = ({fmt: [run[fmt] for run in runs] for fmt in FORMATS} for runs in outputs)
    return before, after


def main() -> None:
    parser = paired_parser(__doc__, repeat=REPEAT)
    parser.add_argument("--lines", type=int, default=LINES, help="per round")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.lines, args.rounds)))
        return
    if args.worker_tree is None:
        for fmt, micros in measure(args.lines, args.rounds).items():
            print(f"{fmt}: {micros:.1f} µs per call line")
        return
    theirs, ours = in_children(args.worker_tree, args.lines, args.rounds, args.repeat)
    print(f"µs per call line, median of {args.repeat} processes each")
    print(f"{'format':<8}{args.worker_tree!s:>24}{'this checkout':>16}{'ratio':>8}")
    for fmt in FORMATS:
        old, new = statistics.median(theirs[fmt]), statistics.median(ours[fmt])
        print(f"{fmt:<8}{old:>24.1f}{new:>16.1f}{new / old:>7.2f}x")


if __name__ == "__main__":
    main()
