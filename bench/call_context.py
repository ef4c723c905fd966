"""What a call's own context (its `RunningCall`, found by key for a cancel) costs an `echo`.

Run: `make bench-call-context` or `.venv/bin/python bench/call_context.py [--rounds N
--calls N]`. In-process, no broker: first `echo` through `Pipeline.handle` as a message
without an id (as `toolbus bench` sends it; memory dedup store, no tracing SDK), then
the per-call steps the running call adds, alone, exactly as the engine takes them: the
call's key (`Once.key`), its `RunningCall`, its entry in `RunningCalls` for the length of
the call (where a cancel finds it), the span and cancel-cause looks in `Executor.run`, and
in `invoke_within` arming the task for a cancel and the deadline's retiming hooks, then
taking them down. CPU µs per call (`time.process_time`), the fastest of `--rounds` rounds
of `--calls` calls; last the share of the one in the other. `--worker-tree DIR` times
`Pipeline.handle` of DIR's `toolbus` beside this checkout's (alternating processes, median
of `--repeat`, default 3; bench/paired.py), e.g. DIR at the commit before calls had them.

The cancel subscription (`{prefix}/cancel/#`, on the reply connection) costs a call
nothing here or on the wire: it is one subscription made at start, which no request or
reply matches. The end-to-end pair (the worker before and after both came in, on the
echo bench) is in bench/README.md, "The new paths measured".
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry import trace
from paired import alternate, paired_parser  # bench/paired.py: this script's folder

from toolbus.config import Settings
from toolbus.dedup import MemoryStore, Once
from toolbus.observability.metrics import Metrics
from toolbus.wire.messages import Inbound, Outbound
from toolbus.worker.wiring import build_executor, build_registry, topics_for

ROUNDS = 15
CALLS_PER_ROUND = 2000
REPEAT = 3
CHILD_TIMEOUT_S = 600
REPLY_TOPIC = "tb/reply/bench"


class Discard:
    """A publisher that drops what it is given: only the worker's side is measured."""

    async def publish(self, out: Outbound) -> None:
        return None


async def handle_us(rounds: int, calls: int) -> float:
    """`echo` through `Pipeline.handle`, CPU µs per call."""
    pipeline_class = _found("Pipeline", "toolbus.doors.envelope.pipeline", "toolbus.calls.pipeline")
    builtin = _found("BUILTIN_TOOLS", "toolbus.backends.local", "toolbus.tools.builtin")
    settings = Settings.model_validate({"topic_prefix": "tb"})
    executor = build_executor(settings, build_registry(builtin, settings), metrics=Metrics())
    pipeline = pipeline_class(
        executor,
        topics_for(settings),
        Discard(),
        worker_id="bench",
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
        once=Once(MemoryStore("bench", 1024), 60.0, executor.idempotent),
    )
    message = Inbound(
        topic="tb/call/echo",
        payload=json.dumps({"arguments": {"text": "benchmark"}}).encode(),
        response_topic=REPLY_TOPIC,
        correlation_data=b"c",
    )
    fastest = float("inf")
    async with pipeline:
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(calls):
                await pipeline.handle(message)
            fastest = min(fastest, (time.process_time() - started) / calls * 1e6)
    return fastest


def _found(name: str, *modules: str) -> Any:
    """`name` from the first of `modules` the measured tree has: the envelope pipeline and
    the built-in tools moved (to doors/ and backends/) when the doors left the engine."""
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError:
            continue
    raise ImportError(f"no {name} in this toolbus")


async def context_us(rounds: int, calls: int) -> float | None:
    """The running call's steps alone (calls/answer.py `_admitted`, calls/execute.py
    `run`, calls/invocation.py `invoke_within`), CPU µs per call; None in a tree whose
    calls had none, or other ones."""
    try:
        found = importlib.import_module("toolbus.calls.running")
        RunningCall, RunningCalls = found.RunningCall, found.RunningCalls  # noqa: N806 -- classes
        RunningCall(None, None, "probe", None, None, extend_on_progress=False)
    except (ImportError, TypeError):  # none, or one with other steps (older trees)
        return None
    running = RunningCalls()
    task = asyncio.current_task()
    assert task is not None
    span = trace.get_current_span()

    def retime(seconds: float | None) -> None:
        return None

    fastest = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for n in range(calls):
            ident = f"c{n}"
            # _admitted: the call's home, found by its key from claim to reply
            key = Once.key(None, REPLY_TOPIC, ident)
            home = RunningCall(key, None, ident, None, None, extend_on_progress=False)
            home.status_sink, home.resume = None, None
            with running.running(home):
                home.span = span
                # Executor.run: cancelled before it started? progress events' span
                if home.cancel_cause is not None:
                    raise AssertionError
                home.span = trace.get_current_span()
                # invoke_within: armed for a cancel, the deadline's hooks, then down again
                context = home if isinstance(home, RunningCall) else None
                assert context is not None
                context.arm(task)  # type: ignore[arg-type]
                context.retiming(retime)
                context.disarm()
                context.extending(None)
                context.retiming(None)
                context.span = None
                if context.delivered:
                    raise AssertionError
        fastest = min(fastest, (time.process_time() - started) / calls * 1e6)
    return fastest


def measure(rounds: int, calls: int) -> dict[str, float | None]:
    logging.getLogger("toolbus").setLevel(logging.WARNING)  # the call line is measured elsewhere
    return {
        "handle_us": asyncio.run(handle_us(rounds, calls)),
        "context_us": asyncio.run(context_us(rounds, calls)),
    }


def main() -> None:
    parser = paired_parser(__doc__, repeat=REPEAT)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--calls", type=int, default=CALLS_PER_ROUND, help="per round")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds, args.calls)))
        return
    fastest = f"fastest of {args.rounds} x {args.calls}"
    if args.worker_tree is None:
        figures = measure(args.rounds, args.calls)
        whole, context = figures["handle_us"], figures["context_us"]
        assert whole is not None
        assert context is not None
        print(f"echo through Pipeline.handle, CPU µs per call ({fastest})  {whole:6.1f}")
        print(f"the running call's own steps, CPU µs per call             {context:6.1f}")
        print(f"their share of the call                                    {context / whole:6.1%}")
        return
    sizes = ("--rounds", str(args.rounds), "--calls", str(args.calls))
    theirs, ours = alternate(
        __file__, args.worker_tree, sizes, repeat=args.repeat, timeout_s=CHILD_TIMEOUT_S
    )
    before = statistics.median(run["handle_us"] for run in theirs)
    after = statistics.median(run["handle_us"] for run in ours)
    print(f"echo through Pipeline.handle, CPU µs per call ({fastest}), median of {args.repeat}")
    ratio = after / before
    print(f"  {args.worker_tree}: {before:.1f}   this checkout: {after:.1f}   {ratio:.3f}x")


if __name__ == "__main__":
    main()
