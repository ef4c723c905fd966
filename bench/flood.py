"""The flood soak: N requests published at once to one worker; its memory along the way.

Run: `make bench-flood` (100 000 requests, a few minutes) or `.venv/bin/python
bench/flood.py --requests N [--worker-tree DIR]`. A private mosquitto on a free loopback
port, one `toolbus serve` process (so its RSS is its own), and the requests published
from this process as fast as the broker takes them. The suite runs the same flood with
20 000 requests (tests/worker/test_chaos.py); docs/reliability.md has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.paired import package_of
from tests.support.fleet import WorkerProcess, flood, recording_env
from tests.support.harness import Broker


async def soak(requests: int, timeout_s: float, worker_tree: Path | None) -> str:
    with tempfile.TemporaryDirectory(prefix="toolbus-flood-") as scratch:
        directory = Path(scratch)
        (directory / "broker").mkdir()
        broker = Broker(directory / "broker", max_queued_messages=requests * 2)
        broker.start()
        try:
            prefix = f"fl{uuid.uuid4().hex[:8]}"
            env = recording_env(directory, prefix, worker_id=f"{prefix}-w1")
            if worker_tree is not None:  # its package imported as `toolbus`, first
                (directory / "tree").mkdir()
                (directory / "tree" / "toolbus").symlink_to(package_of(worker_tree))
                env["PYTHONPATH"] = f"{directory / 'tree'}{os.pathsep}{env['PYTHONPATH']}"
            worker = WorkerProcess(broker.url, env)
            await worker.start()
            try:
                result = await flood(broker.url, prefix, worker, requests, timeout_s)
            finally:
                await worker.stop()
        finally:
            broker.stop()
    return result.line()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for all replies")
    parser.add_argument(
        "--worker-tree",
        type=Path,
        help="run the worker from another checkout (a `git worktree` of an older commit) "
        "for a before/after pair",
    )
    args = parser.parse_args()
    tree = args.worker_tree.resolve() if args.worker_tree else None
    print(asyncio.run(soak(args.requests, args.timeout, tree)))


if __name__ == "__main__":
    main()
