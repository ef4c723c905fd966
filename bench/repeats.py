"""What deduplication costs a call: one with its own id beside one without, in-process.

Run: `.venv/bin/python bench/repeats.py [--rounds N --calls N]` (the tests run it with tiny
numbers so it cannot rot). Each call goes through `Pipeline.handle` as a message, to the
built-in `echo`, with the memory dedup store and no tracing SDK: a call with an id is
prepared, claimed, run and closed in the store; one without is prepared and run. Two
argument sets: `{"text": "hi"}` as the schema asks (the settled fast path), and
`{"text": 7}`, a value to shape (the full normalization path). Figures are CPU µs per
call (`time.process_time`: a shared machine's other processes count less), the fastest
of `--rounds` rounds of `--calls` calls, each call with an id under a fresh id.

`--profile CASE` (e.g. "as asked, no id") runs that case once more under cProfile and
prints the Python function calls a message costs and the top entries by own time: the
in-process view beside bench/profile_stages.py's py-spy view of a worker under load.

`--worker-tree DIR` measures DIR's `toolbus` package (e.g. `git archive` of an older commit)
beside this checkout's, each in processes of its own, alternating `--repeat` times
(default 3), and prints the median of each: a before/after pair from one run.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import logging
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from paired import (  # bench/paired.py: this script's folder is first on the path
    alternate,
    paired_parser,
    print_paired,
)
from rich.console import Console
from rich.table import Table

from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.config import Settings
from toolbus.dedup import MemoryStore, Once
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.observability.metrics import Metrics
from toolbus.wire.messages import Inbound, Outbound
from toolbus.worker.wiring import build_executor, build_registry, topics_for

ROUNDS = 15
CALLS_PER_ROUND = 2000
REPEAT = 3
CHILD_TIMEOUT_S = 600
ARGUMENTS: dict[str, dict[str, Any]] = {"as asked": {"text": "hi"}, "to shape": {"text": 7}}
CASES = tuple(f"{name}, {ident}" for name in ARGUMENTS for ident in ("with id", "no id"))


class Discard:
    """A publisher that drops what it is given: only the worker's side is measured."""

    async def publish(self, out: Outbound) -> None:
        return None


async def per_call_us(
    arguments: dict[str, Any], *, with_id: bool, rounds: int, calls: int
) -> float:
    settings = Settings.model_validate({"topic_prefix": "tb"})
    executor = build_executor(settings, build_registry(BUILTIN_TOOLS, settings), metrics=Metrics())
    once = Once(MemoryStore("bench", rounds * calls + 1), 60.0, executor.idempotent)
    pipeline = Pipeline(
        executor,
        topics_for(settings),
        Discard(),
        worker_id="bench",
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
        once=once,
    )
    sent = 0

    def message() -> Inbound:
        nonlocal sent
        sent += 1
        body = {"arguments": arguments} | ({"id": f"r{sent}"} if with_id else {})
        return Inbound(
            topic="tb/call/echo",
            payload=json.dumps(body).encode(),
            response_topic="tb/reply/bench",
            correlation_data=b"c",
        )

    fastest = float("inf")
    async with pipeline:
        for _ in range(rounds):
            messages = [message() for _ in range(calls)]
            started = time.process_time()
            for each in messages:
                await pipeline.handle(each)
            fastest = min(fastest, (time.process_time() - started) / calls * 1e6)
    return fastest


def measure(rounds: int, calls: int) -> dict[str, float]:
    logging.getLogger("toolbus").setLevel(logging.WARNING)  # the call line is measured elsewhere
    figures = {}
    for name, arguments in ARGUMENTS.items():
        for with_id in (True, False):
            figures[f"{name}, {'with id' if with_id else 'no id'}"] = asyncio.run(
                per_call_us(arguments, with_id=with_id, rounds=rounds, calls=calls)
            )
    return figures


def profile(case: str, calls: int, top: int = 25) -> None:
    """`case` under cProfile: function calls per message, then the top entries."""
    name, _, ident = case.partition(", ")
    if name not in ARGUMENTS or ident not in ("with id", "no id"):
        sys.exit(f"--profile: one of {', '.join(CASES)}")
    logging.getLogger("toolbus").setLevel(logging.WARNING)
    run = per_call_us(ARGUMENTS[name], with_id=ident == "with id", rounds=1, calls=calls)
    profiler = cProfile.Profile()
    profiler.runcall(asyncio.run, run)
    stats = pstats.Stats(profiler)
    total = getattr(stats, "total_calls", 0)  # set by pstats, not in its stubs
    print(f"{case}: {total / calls:.0f} Python function calls a message (set-up included)")
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = paired_parser(__doc__, repeat=REPEAT)
    parser.add_argument("--profile", metavar="CASE", help="this case under cProfile")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS_PER_ROUND, help="per round")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile, args.calls)
        return
    if args.child:
        print(json.dumps(measure(args.rounds, args.calls)))
        return
    title = (
        f"echo through Pipeline.handle, CPU µs per call, fastest of {args.rounds} x {args.calls}"
    )
    if args.worker_tree is None:
        table = Table(title=title)
        table.add_column("call")
        table.add_column("µs", justify="right")
        for name, figure in measure(args.rounds, args.calls).items():
            table.add_row(name, f"{figure:.1f}")
        Console().print(table)
        return
    sizes = ("--rounds", str(args.rounds), "--calls", str(args.calls))
    outputs = alternate(
        __file__, args.worker_tree, sizes, repeat=args.repeat, timeout_s=CHILD_TIMEOUT_S
    )
    print_paired(title, "call", list(CASES), outputs, tree=args.worker_tree, repeat=args.repeat)


if __name__ == "__main__":
    main()
