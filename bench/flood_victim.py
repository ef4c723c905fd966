"""What one caller's flood does to another: a victim's echo latency, and where the flood went.

Run: `make bench-flood-victim` or `.venv/bin/python bench/flood_victim.py [--quick]
[--flood N] [--json PATH]` (about 2 minutes on a shared 2-core machine; `--quick`, under
one). Every part is a process of its own: a private mosquitto on a free loopback port,
one `toolbus serve` (`caller_identity = "topic"`, log level INFO as shipped: a line per
call), the flooder (this script with `--flooder`), and the victim in this process.

For each shipped broker configuration, run as written but on a free port and with
`sys_interval 1` (config/mosquitto.conf, which `make run` starts, and the compose stack's),
and for quotas off and on (`[callers."*"]` as docs/configuration.md's example:
`rate_per_s = 20`, `burst = 40`, `max_in_flight = 8`), a fresh worker:

- the victim alone: `echo` calls on `{prefix}/call/victim/echo`, QoS 1, `--rate` a second
  (open loop: each on time whatever the last one did), each waited for at most 60 s;
- then the same while the flooder publishes `--flood` `echo` calls on
  `{prefix}/call/flooder/echo` (QoS 1, each with its own id, as fast as the broker takes
  them) and counts what came back: answered `ok`, refused (by error code), or nothing.
  The flood ends when every call is answered or no reply came for 3 s.

"Dropped by the broker" is mosquitto's own count (`$SYS/broker/publish/messages/dropped`),
the victim's drops included. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fleet import (
    SHIPPED_BROKERS,
    BrokerDrops,
    WorkerProcess,
    recording_env,
    shipped_broker,
)
from tests.support.harness import Broker
from tests.support.mqtt import Caller

QUOTA = {"rate_per_s": 20, "burst": 40, "max_in_flight": 8}
VICTIM_WAIT_S = 60.0
FLOOD_IDLE_S = 3.0  # no reply for this long: the rest of the flood is not coming


@dataclass(frozen=True)
class Sent:
    """One victim call: when it was sent (wall clock, comparable across processes) and
    what came of it (latency when answered `ok`, else the error code or `unanswered`)."""

    at: float
    latency_ms: float | None
    outcome: str


def summary(calls: list[Sent]) -> dict[str, Any]:
    ordered = sorted(c.latency_ms for c in calls if c.latency_ms is not None)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else None
    return {
        "calls": len(calls),
        "p50_ms": round(statistics.median(ordered), 1) if ordered else None,
        "p99_ms": round(p99, 1) if p99 is not None else None,
        "outcomes": dict(Counter(c.outcome for c in calls)),
    }


async def victim_calls(
    caller: Caller, prefix: str, rate: float, until: asyncio.Event
) -> list[Sent]:
    """`rate` echo calls a second until `until` is set; then every call's outcome."""
    loop = asyncio.get_running_loop()

    async def one(n: int) -> Sent:
        at, started = time.time(), loop.time()
        try:
            reply, _ = await caller.call(
                f"{prefix}/call/victim/echo",
                {"arguments": {"text": f"v{n}"}},
                reply_topic=f"{prefix}/reply/victim/r",
                timeout_s=VICTIM_WAIT_S,
            )
        except TimeoutError:
            return Sent(at, None, "unanswered")
        if reply["ok"]:
            return Sent(at, (loop.time() - started) * 1000, "ok")
        return Sent(at, None, str(reply["error"]["code"]))

    calls: list[asyncio.Task[Sent]] = []
    start = loop.time()
    while not until.is_set():
        calls.append(asyncio.create_task(one(len(calls))))
        next_at = start + len(calls) / rate
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(next_at):
                await until.wait()
    return list(await asyncio.gather(*calls))


async def flood_phase(
    broker: Broker, rate: float, flood: int, baseline_s: float, quotas: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="toolbus-victim-") as scratch:
        prefix = f"fv{uuid.uuid4().hex[:8]}"
        callers = {"*": QUOTA} if quotas else {}
        env = recording_env(
            Path(scratch), prefix, caller_identity="topic", callers=json.dumps(callers)
        )
        worker = WorkerProcess(broker.url, env)
        await worker.start()
        try:
            async with Caller(broker.url) as victim, BrokerDrops(broker.url) as drops:
                alone_done = asyncio.Event()
                asyncio.get_running_loop().call_later(baseline_s, alone_done.set)
                alone = await victim_calls(victim, prefix, rate, alone_done)
                flooded_done = asyncio.Event()
                during = asyncio.create_task(victim_calls(victim, prefix, rate, flooded_done))
                try:
                    flooder = await run_flooder(broker.url, prefix, flood)
                finally:
                    flooded_done.set()
                    flooded = await during
                # The victim's calls sent while the flood ran: from its first publish to
                # its last answer (the idle wait after it is not the flood's).
                window = [
                    c for c in flooded if flooder["started_at"] <= c.at <= flooder["ended_at"]
                ]
                # The flood ended FLOOD_IDLE_S after its last answer: the count is out.
                dropped = drops.so_far()
        finally:
            await worker.stop()
    return {
        "quotas": callers,
        "victim_alone": summary(alone),
        "victim_flooded": summary(window),
        "victim_after": summary([c for c in flooded if c.at > flooder["ended_at"]]),
        "flood": flooder,
        "dropped_by_broker": dropped,
    }


async def run_flooder(url: str, prefix: str, flood: int) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--flooder",
        url,
        prefix,
        str(flood),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the flooder failed ({process.returncode})")
    return dict(json.loads(out.decode().splitlines()[-1]))


async def flooder(url: str, prefix: str, flood: int) -> dict[str, Any]:
    """The flooding caller: every call published at once (QoS 1), then every answer.

    Answers are read on a connection of their own, never busy publishing, so what goes
    missing was dropped on the way to the worker, not on the way back."""
    outcomes: dict[str, str] = {}
    reply_topic = f"{prefix}/reply/flooder/r"
    async with Caller(url) as reader, Caller(url) as sender:
        await reader.subscribe(reply_topic)
        started_at, started = time.time(), time.monotonic()
        ended_at = started_at
        for first in range(0, flood, 1000):
            await asyncio.gather(
                *(
                    sender.publish(
                        f"{prefix}/call/flooder/echo",
                        f'{{"id": "f{n}", "arguments": {{"text": "x"}}}}',
                        response_topic=reply_topic,
                    )
                    for n in range(first, min(first + 1000, flood))
                )
            )
        published_s = time.monotonic() - started
        while len(outcomes) < flood:
            try:
                message = await reader.next_message(timeout_s=FLOOD_IDLE_S)
            except TimeoutError:
                break
            ended_at = time.time()
            reply = json.loads(message.payload)
            outcomes[reply["id"]] = "ok" if reply["ok"] else reply["error"]["code"]
    counts = Counter(outcomes.values())
    return {
        "calls": flood,
        "published_s": round(published_s, 2),
        "answered_ok": counts.pop("ok", 0),
        "refused": dict(counts),
        "never_answered": flood - len(outcomes),
        "seconds": round(ended_at - started_at, 1),
        "started_at": started_at,
        "ended_at": ended_at,
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| broker config | quotas | victim alone p50 / p99 ms | victim flooded p50 / p99 ms "
        "| victim not ok | flood: ok | refused | never answered | dropped by broker | flood s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        a, f, fl = run["victim_alone"], run["victim_flooded"], run["flood"]
        refused = ", ".join(f"{code} {n}" for code, n in fl["refused"].items()) or "0"
        lines.append(
            f"| {run['broker']} | {'on' if run['quotas'] else 'off'} "
            f"| {a['p50_ms']} / {a['p99_ms']} | {f['p50_ms']} / {f['p99_ms']} "
            f"| {f['calls'] - f['outcomes'].get('ok', 0)} of {f['calls']} "
            f"| {fl['answered_ok']} | {refused} "
            f"| {fl['never_answered']} | {run['dropped_by_broker']} | {fl['seconds']} |"
        )
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for name in SHIPPED_BROKERS:
        with tempfile.TemporaryDirectory(prefix="toolbus-victim-broker-") as scratch:
            broker = shipped_broker(Path(scratch), name)
            broker.start()
            try:
                for quotas in (False, True):
                    run = await flood_phase(broker, args.rate, args.flood, args.baseline_s, quotas)
                    runs.append({"broker": name, **run})
                    print(
                        f"{name}, quotas {'on' if quotas else 'off'}: {json.dumps(run)}",
                        file=sys.stderr,
                    )
            finally:
                broker.stop()
    return runs


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--flooder":
        print(json.dumps(asyncio.run(flooder(sys.argv[2], sys.argv[3], int(sys.argv[4])))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller flood, a shorter baseline")
    parser.add_argument("--flood", type=int, help="calls in the flood (5 000; --quick 2 000)")
    parser.add_argument("--rate", type=float, default=10.0, help="the victim's calls a second")
    parser.add_argument("--baseline-s", type=float, help="the victim alone (5 s; --quick 2 s)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    args.flood = args.flood or (2_000 if args.quick else 5_000)
    args.baseline_s = args.baseline_s or (2.0 if args.quick else 5.0)
    runs = asyncio.run(bench(args))
    if args.json:
        args.json.write_text(
            json.dumps({"flood": args.flood, "rate": args.rate, "runs": runs}, indent=2)
        )
    print(table(runs))


if __name__ == "__main__":
    main()
