"""Progress relay throughput and a task's overhead, through a `toolbus serve` of its own.

Run: `make bench-progress` or `.venv/bin/python bench/progress_tasks.py [--updates N
--calls N --rounds N]`. A private mosquitto (TCP_NODELAY, as shipped) and `toolbus serve`
in its own process (its CPU read from /proc, as `toolbus bench` reads it), with two local
tools from a plugin package written to a scratch directory (the `toolbus.tools` entry
point, as a user installs tools) and `progress_rate_per_s = 0` (no rate limit: what the
relay itself carries). The caller is one MQTT v5 connection in this process.

- **Progress**: `chunks(n)` reports `n` updates through `toolbus.progress`, yielding to the
  loop after each (as a tool awaiting its work would), then returns. Called with
  `"progress": true`, then the same call without: updates the caller received a second
  (from the request to the reply), the worker's CPU per call, and per update received
  (the difference between the two, over the updates: what relaying one costs).
- **Task**: `quick()` returns at once; `quick_task` is the same body, configured
  `task = true`. Sequential calls of each, alternating in rounds: latency to the reply
  with `ok` (a task's caller gets its `task` state first, then the end pushed), p50 and
  p99, and the worker's CPU per call.

Figures are a shared machine's: compare the pairs of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus.cli.bench import cpu
from toolbus.cli.bench.mosquitto import private_broker
from toolbus.cli.bench.served import Probe, ServeOptions, served_worker
from toolbus.transport import MqttConnection
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Inbound, Outbound

PREFIX = "benchpt"
REPLY_BOUND_S = 60.0
PLUGIN = textwrap.dedent(
    '''
    """Tools for bench/progress_tasks.py."""
    import asyncio

    import toolbus


    @toolbus.tool
    async def chunks(n: int) -> int:
        """Reports n progress updates, one a loop turn, then returns n."""
        for step in range(1, n + 1):
            toolbus.progress(step, n)
            await asyncio.sleep(0)
        return n


    @toolbus.tool
    async def quick(text: str) -> str:
        """Returns its text at once."""
        return text


    @toolbus.tool
    async def quick_task(text: str) -> str:
        """Returns its text at once (configured task = true)."""
        return text
    '''
)


@dataclass(frozen=True, slots=True)
class Exchange:
    seconds: float
    updates: int  # progress messages received before the reply
    first: str  # the first message's type: "progress", "task" or "reply"


class Caller:
    """One MQTT v5 connection: a request out, every message of it in until the reply."""

    def __init__(self, connection: MqttConnection) -> None:
        self.connection = connection
        self.reply_topic = f"{PREFIX}/reply/{uuid.uuid4().hex[:8]}"
        self.messages = connection.messages()

    async def call(self, tool: str, body: dict[str, Any]) -> Exchange:
        correlation = uuid.uuid4().bytes
        started = time.perf_counter()
        await self.connection.publish(
            Outbound(
                topic=f"{PREFIX}/call/{tool}",
                payload=json.dumps(body).encode(),
                response_topic=self.reply_topic,
                correlation_data=correlation,
            )
        )
        updates, first = 0, ""
        async with asyncio.timeout(REPLY_BOUND_S):
            while True:
                message: Inbound = await anext(self.messages)
                if message.correlation_data != correlation:
                    continue
                answer = json.loads(message.payload)
                kind = "reply" if "ok" in answer else str(answer.get("type"))
                first = first or kind
                if kind == "reply":
                    if answer["ok"] is not True:
                        raise RuntimeError(f"{tool} failed: {answer.get('error')}")
                    return Exchange(time.perf_counter() - started, updates, first)
                updates += kind == "progress"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def progress_phase(
    caller: Caller, worker: set[int], updates: int, rounds: int
) -> dict[str, float]:
    """Rounds of one call with progress and one without, alternating."""
    spent = {True: 0.0, False: 0.0}
    took = {True: 0.0, False: 0.0}
    received = 0
    for _ in range(rounds):
        for asked in (True, False):
            before = cpu.read(worker)
            done = await caller.call(
                "chunks", {"id": uuid.uuid4().hex, "arguments": {"n": updates}, "progress": asked}
            )
            spent[asked] += cpu.read(worker).seconds_since(before)
            took[asked] += done.seconds
            if asked:
                received += done.updates
            elif done.updates:
                raise RuntimeError("progress arrived for a call that did not ask for it")
    return {
        "updates_reported": updates * rounds,
        "updates_received": received,
        "updates_per_s": received / took[True],
        "call_ms_with": took[True] / rounds * 1e3,
        "call_ms_without": took[False] / rounds * 1e3,
        "worker_cpu_ms_with": spent[True] / rounds * 1e3,
        "worker_cpu_ms_without": spent[False] / rounds * 1e3,
        "worker_cpu_us_per_update": (spent[True] - spent[False]) / max(received, 1) * 1e6,
    }


async def task_phase(caller: Caller, worker: set[int], calls: int, rounds: int) -> dict[str, Any]:
    """Rounds of `calls` plain calls, then as many as tasks, alternating."""
    latencies: dict[str, list[float]] = {"plain": [], "task": []}
    spent = {"plain": 0.0, "task": 0.0}
    for _ in range(rounds):
        for kind, tool in (("plain", "quick"), ("task", "quick_task")):
            before = cpu.read(worker)
            for n in range(calls):
                body = {"id": uuid.uuid4().hex, "arguments": {"text": str(n)}}
                done = await caller.call(tool, body)
                if (done.first == "task") != (kind == "task"):
                    raise RuntimeError(f"{tool}: its first message was {done.first}")
                latencies[kind].append(done.seconds * 1e3)
            spent[kind] += cpu.read(worker).seconds_since(before)
    figures: dict[str, Any] = {}
    for kind, took in latencies.items():
        figures[kind] = {
            "p50_ms": statistics.median(took),
            "p99_ms": percentile(took, 0.99),
            "worker_cpu_us_per_call": spent[kind] / len(took) * 1e6,
        }
    task, plain = figures["task"], figures["plain"]
    figures["task_over_plain"] = {  # nan where the plain calls read no CPU tick (10 ms)
        "p50": _ratio(task["p50_ms"], plain["p50_ms"]),
        "cpu": _ratio(task["worker_cpu_us_per_call"], plain["worker_cpu_us_per_call"]),
    }
    return figures


def _ratio(over: float, under: float) -> float:
    return over / under if under else float("nan")


async def measure_with(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    worker = cpu.tree(pid)
    async with MqttConnection(BrokerUrl.from_url(url)) as connection:
        caller = Caller(connection)
        await connection.subscribe([caller.reply_topic])
        await caller.call("quick_task", {"arguments": {"text": "warm"}})
        await caller.call("chunks", {"arguments": {"n": 10}, "progress": True})
        return {
            "progress": await progress_phase(caller, worker, args.updates, args.rounds),
            "task": await task_phase(caller, worker, args.calls, args.rounds),
        }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="toolbus-bench-pt-") as scratch_name:
        scratch = Path(scratch_name)
        plugins = install_plugin(scratch / "plugins")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(plugins), os.environ.get("PYTHONPATH")) if p
        )
        options = ServeOptions(
            settings=(("progress_rate_per_s", 0), ("tools", {"quick_task": {"task": True}}))
        )
        probes = [Probe(f"{PREFIX}/call/quick", b'{"arguments": {"text": "probe"}}')]
        with (
            private_broker() as broker,
            served_worker(scratch, broker.url, PREFIX, options, probes) as proc,
        ):
            return asyncio.run(measure_with(broker.url, proc.pid, args))


def install_plugin(directory: Path) -> Path:
    """The bench's tools as an installed package: found through the `toolbus.tools`
    entry point once `directory` is on PYTHONPATH."""
    module = "toolbus_bench_tools"
    directory.mkdir(parents=True)
    (directory / f"{module}.py").write_text(PLUGIN)
    dist = directory / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {module}:{name}\n" for name in ("chunks", "quick", "quick_task"))
    (dist / "entry_points.txt").write_text(f"[toolbus.tools]\n{lines}")
    return directory


def report(figures: dict[str, Any], args: argparse.Namespace) -> list[str]:
    p, t = figures["progress"], figures["task"]
    return [
        f"progress: chunks(n={args.updates}) x {args.rounds}, progress_rate_per_s = 0",
        f"  updates received / reported      {p['updates_received']} / {p['updates_reported']}",
        f"  updates a second, caller's side  {p['updates_per_s']:.0f}",
        f"  call, with / without progress    {p['call_ms_with']:.1f} / "
        f"{p['call_ms_without']:.1f} ms",
        f"  worker CPU, with / without       {p['worker_cpu_ms_with']:.1f} / "
        f"{p['worker_cpu_ms_without']:.1f} ms a call",
        f"  worker CPU per update relayed    {p['worker_cpu_us_per_update']:.0f} us",
        f"task: quick() {args.calls} sequential calls x {args.rounds}, plain and as a task",
        f"  plain  p50 {t['plain']['p50_ms']:.2f} ms  p99 {t['plain']['p99_ms']:.2f} ms  "
        f"worker CPU {t['plain']['worker_cpu_us_per_call']:.0f} us a call",
        f"  task   p50 {t['task']['p50_ms']:.2f} ms  p99 {t['task']['p99_ms']:.2f} ms  "
        f"worker CPU {t['task']['worker_cpu_us_per_call']:.0f} us a call",
        f"  task / plain: p50 {t['task_over_plain']['p50']:.2f}x, "
        f"CPU {t['task_over_plain']['cpu']:.2f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=5000, help="progress updates a call")
    parser.add_argument("--calls", type=int, default=200, help="sequential calls a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    figures = measure(args)
    print("\n".join(report(figures, args)))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
