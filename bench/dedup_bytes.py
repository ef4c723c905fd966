"""What one caller's large calls leave held by the dedup store: a worker's RSS, and a capped Redis.

Run: `.venv/bin/python bench/dedup_bytes.py [--worker-tree DIR] [--echoes N] [--results N]`
(a few minutes a tree at the defaults). A private mosquitto, one `toolbus serve` process
with default settings (the memory store) and a local `report` tool (`tests/support/fleet.py`),
and one caller in a process of its own, 16 requests in flight, each under its own id:

- `echoes`: `--echoes` (4 000) `echo` calls of 62 KB arguments, as the audit sent;
- `results`: `--results` (300) `report` calls answering 1.9 MB each.

For each: the worker's RSS before and after, and its peak (VmHWM). Then `redis`: the same
worker on a Redis capped at 150 MB (`noeviction`), garage's `--redis-results` (100) calls
of 1.9 MB, then kitchen's 20 small calls: how many of kitchen's were answered `ok`.
`--worker-tree DIR` runs the same with another checkout's worker first, for a before/after
pair (the caller is this checkout's).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.oversize import memory_mib
from bench.paired import package_of
from tests.support.fleet import WorkerProcess, recording_env
from tests.support.harness import Broker, RedisServer
from tests.support.mqtt import Caller

PREFIX = "dbb"
IN_FLIGHT = 16
CALL_TIMEOUT_S = 120.0


async def calls(url: str, who: str, kind: str, count: int) -> collections.Counter[str]:
    """The caller's process: `count` calls of `kind`, `IN_FLIGHT` at once; outcomes counted."""
    outcomes: collections.Counter[str] = collections.Counter()
    slots = asyncio.Semaphore(IN_FLIGHT)
    async with Caller(url) as caller:

        async def one(n: int) -> None:
            if kind == "echo":
                tool, arguments = "echo", {"text": "e", "data": ["e" * 1990] * 31}
            else:
                tool, arguments = "report", {"key": f"{who}{n}", "size": int(kind)}
            body = {"id": f"{who}-{n}", "caller": who, "arguments": arguments}
            async with slots:
                reply, _ = await caller.call(
                    f"{PREFIX}/call/{tool}",
                    body,
                    reply_topic=f"{PREFIX}/reply/{who}",
                    timeout_s=CALL_TIMEOUT_S,
                )
            error = reply.get("error")
            outcomes["ok" if reply["ok"] else str(error and error["code"])] += 1

        await asyncio.gather(*(one(n) for n in range(count)))
    return outcomes


async def in_child(url: str, who: str, kind: str, count: int) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--caller",
        url,
        who,
        kind,
        str(count),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode:
        raise SystemExit(f"the caller's process failed ({proc.returncode})")
    return out.decode().strip()


async def phase(url: str, worker: WorkerProcess, name: str, kind: str, count: int) -> str:
    before = memory_mib(worker.pid)
    outcomes = await in_child(url, "garage", kind, count)
    after = memory_mib(worker.pid)
    return (
        f"{name:8} {count:5} calls ({outcomes}): worker RSS {before['VmRSS']:4.0f} -> "
        f"{after['VmRSS']:4.0f} MiB, peak {after['VmHWM']:4.0f} MiB"
    )


async def run(args: argparse.Namespace, tree: Path | None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="toolbus-dedup-bytes-") as scratch:
        directory = Path(scratch)
        broker = Broker(directory, max_queued_messages=100_000)
        broker.start()
        redis = RedisServer("--maxmemory", "150mb", "--maxmemory-policy", "noeviction")
        redis.start()
        try:
            env = recording_env(directory, PREFIX, log_level="WARNING")
            if tree is not None:  # its package imported as `toolbus`, first
                (directory / "tree").mkdir()
                (directory / "tree" / "toolbus").symlink_to(package_of(tree))
                env["PYTHONPATH"] = os.pathsep.join([str(directory / "tree"), env["PYTHONPATH"]])
            lines = []
            for name, kind, count in (
                ("echoes", "echo", args.echoes),
                ("results", str(args.size), args.results),
            ):
                worker = WorkerProcess(broker.url, {**env, "TOOLBUS_LOG_LEVEL": "INFO"})
                await worker.start()
                try:
                    lines.append(await phase(broker.url, worker, name, kind, count))
                finally:
                    await worker.stop()
            redis_env = {**env, "TOOLBUS_LOG_LEVEL": "INFO", "TOOLBUS_DEDUP_STORE": redis.url}
            worker = WorkerProcess(broker.url, redis_env)
            await worker.start()
            try:
                flood = await in_child(broker.url, "garage", str(args.size), args.redis_results)
                quiet = await in_child(broker.url, "kitchen", "100", 20)
            finally:
                await worker.stop()
            lines.append(f"redis    garage {flood}; then kitchen's 20 calls: {quiet}")
            return lines
        finally:
            redis.stop()
            broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--worker-tree", type=Path, help="also run DIR/worker's worker, first")
    parser.add_argument("--echoes", type=int, default=4000)
    parser.add_argument("--results", type=int, default=300)
    parser.add_argument("--redis-results", type=int, default=100)
    parser.add_argument("--size", type=int, default=1_900_000, help="characters a result")
    parser.add_argument("--caller", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.caller:
        url, who, kind, count = args.caller
        print(dict(asyncio.run(calls(url, who, kind, int(count)))), flush=True)
        return
    trees = [args.worker_tree.resolve()] if args.worker_tree else []
    for tree in [*trees, None]:
        print(f"worker: {tree or 'this checkout'}", flush=True)
        for line in asyncio.run(run(args, tree)):
            print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
