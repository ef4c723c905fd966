"""Oversize requests: what one attacker's packets cost a victim's echo and the worker's memory.

Run: `.venv/bin/python bench/oversize.py [--worker-tree DIR]` (about a minute a tree).
A private mosquitto on a free loopback port with no `max_packet_size` of its own (so
only the worker's bound stands, as with a broker that sets none), one `toolbus serve`
process (so its RSS is its own), a victim in this process starting an `echo` call
every 50 ms (answered or not: a frozen worker delays every call due), and the attacker
in a process of its own. Three phases, each until the attacker is done and a request
it sent last is answered (the broker delivers in order, so by then the worker has had
everything the attacker sent):

- `quiet`: no attack, for `--quiet-s` seconds;
- `user-properties`: `--props-requests` (2) requests of 400 KB: `--props` (40 000) empty
  user properties (240 KB) and `--props-payload` (160 KB). The audit sent 20 of 1 MB
  with 60 000, each 9.3 s of a frozen worker on its machine; on a shared 2-core one,
  three of them held a victim's call past 300 s on 03d6bec, hence the smaller default;
- `payload`: `--payload-requests` (16) requests of `--payload-mib` (16) MiB (the audit
  sent 28 of 100 MB).

For each: the victim's calls, their median, p99 and slowest latency, and the worker's
RSS before and after and its peak (VmHWM). `--worker-tree DIR` runs the same with the
worker of another checkout first, for a before/after pair (the victim and attacker are
this checkout's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.paired import package_of
from tests.cli.test_cli import cli_env
from tests.support.fleet import WorkerProcess
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.packets import properties

PREFIX = "ov"
ECHO = f"{PREFIX}/call/echo"
CALL_TIMEOUT_S = 300.0  # a victim's call behind a frozen worker on the base
PACE_S = 0.05  # the victim starts a call 20 times a second


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) in MiB, from /proc/<pid>/status."""
    fields = (line.partition(":") for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(v.split()[0]) / 1024 for k, _, v in fields if k in {"VmRSS", "VmHWM"}}


async def attack(url: str, kind: str, requests: int, payload_bytes: int, props: int) -> None:
    """The attacker's process: `requests` raw requests, then one it waits an answer for."""
    reply = f"{PREFIX}/reply/attacker"
    async with Caller(url) as attacker:
        await attacker.subscribe(reply)
        raw = properties(response_topic=reply, correlation=b"attack", user_properties=props)
        for _ in range(requests):
            await attacker.client.publish(ECHO, b"x" * payload_bytes, qos=1, properties=raw)
        await attacker.call(
            ECHO, {"arguments": {"text": kind}}, reply_topic=reply, timeout_s=CALL_TIMEOUT_S
        )


async def phase(url: str, worker: WorkerProcess, name: str, attacker: list[str]) -> str:
    """The victim's echo calls, one started every `PACE_S` whether or not the last one
    was answered (a frozen worker then delays every call due, not just one), while the
    attacker runs; or for `attacker[1]` seconds when it is `quiet`."""
    before = memory_mib(worker.pid)
    proc = None
    if attacker[0] != "quiet":
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--attacker", url, *attacker
        )
    end = time.monotonic() + (float(attacker[1]) if proc is None else 0)
    async with Caller(url) as victim:

        async def timed() -> float:
            started = time.monotonic()
            answer, _ = await victim.call(
                ECHO,
                {"arguments": {"text": "victim"}},
                reply_topic=f"{PREFIX}/reply/victim",
                timeout_s=CALL_TIMEOUT_S,
            )
            assert answer["ok"], answer
            return (time.monotonic() - started) * 1000

        calls = []
        while (proc is None and time.monotonic() < end) or (
            proc is not None and proc.returncode is None
        ):
            calls.append(asyncio.create_task(timed()))
            await asyncio.sleep(PACE_S)  # pacing, not synchronisation: a caller's rhythm
        latencies = sorted(await asyncio.gather(*calls))
    if proc is not None and await proc.wait() != 0:
        raise SystemExit(f"the attacker of {name} failed")
    after = memory_mib(worker.pid)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return (
        f"{name:16} victim {len(latencies):4} calls: median {statistics.median(latencies):8.1f}"
        f" ms, p99 {p99:8.1f} ms, max {latencies[-1]:8.1f} ms; worker RSS "
        f"{before['VmRSS']:4.0f} -> {after['VmRSS']:4.0f} MiB, peak {after['VmHWM']:4.0f} MiB"
    )


async def run(args: argparse.Namespace, tree: Path | None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="toolbus-oversize-") as scratch:
        directory = Path(scratch)
        broker = Broker(directory, max_queued_messages=100_000)
        broker.start()
        try:
            env = cli_env(PREFIX)
            if tree is not None:  # its package imported as `toolbus`, first
                (directory / "tree").mkdir()
                (directory / "tree" / "toolbus").symlink_to(package_of(tree))
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(directory / "tree"), env.get("PYTHONPATH", "")]
                )
            worker = WorkerProcess(broker.url, env)
            await worker.start()
            try:
                props = [str(args.props_requests), str(args.props_payload), str(args.props)]
                payload = [str(args.payload_requests), str(args.payload_mib << 20), "0"]
                return [
                    await phase(broker.url, worker, "quiet", ["quiet", str(args.quiet_s)]),
                    await phase(broker.url, worker, "user-properties", ["props", *props]),
                    await phase(broker.url, worker, "payload", ["payload", *payload]),
                ]
            finally:
                await worker.stop()
        finally:
            broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-tree", type=Path, help="also run DIR/worker's worker, first")
    parser.add_argument("--quiet-s", type=float, default=3.0)
    parser.add_argument("--props-requests", type=int, default=2)
    parser.add_argument("--props", type=int, default=40_000, help="user properties a request")
    parser.add_argument("--props-payload", type=int, default=160_000, help="bytes beside them")
    parser.add_argument("--payload-requests", type=int, default=16)
    parser.add_argument("--payload-mib", type=int, default=16)
    parser.add_argument("--attacker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attacker:
        url, kind, requests, payload_bytes, props = args.attacker
        asyncio.run(attack(url, kind, int(requests), int(payload_bytes), int(props)))
        return
    trees = [args.worker_tree.resolve()] if args.worker_tree else []
    for tree in [*trees, None]:
        print(f"worker: {tree or 'this checkout'}", flush=True)
        for line in asyncio.run(run(args, tree)):
            print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
