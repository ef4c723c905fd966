"""What the broker's `set_tcp_nodelay` costs a caller: sequential calls with it on and off.

Run: `make bench-nodelay` or `.venv/bin/python bench/tcp_nodelay.py [--calls N]`. For each
setting, a private mosquitto on a free loopback port (`set_tcp_nodelay true`, then
`false`) and an in-process worker with the built-in tools; `echo` called one call after
another, first on one kept `toolbus.Client` (TCP_NODELAY on the client's side, as every
toolbus client sets it), then with `mosquitto_rr` (one process, connection and reply
subscription per call, as docs/integrations.md shows), which leaves Nagle's algorithm on
unless given `--nodelay`. What the broker's setting changes is how soon the broker's own
small packets (the PUBACK, the reply) leave it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus import Client
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.cli.bench.mosquitto import private_broker
from toolbus.config import Settings
from toolbus.worker.wiring import build_worker

PREFIX = "toolbus"
RR_ARGUMENTS = '{"arguments": {"text": "hello"}}'


async def kept(url: str, calls: int) -> list[float]:
    took: list[float] = []
    async with Client(url, prefix=PREFIX) as client:
        await client.call("echo", {"text": "warm"})
        for n in range(calls):
            started = time.perf_counter()
            await client.call("echo", {"text": str(n)})
            took.append((time.perf_counter() - started) * 1000)
    return took


async def rr(port: int, calls: int, *flags: str) -> list[float]:
    took: list[float] = []
    command = ["mosquitto_rr", "-p", str(port), "-q", "1", "-W", "10", *flags]
    command += ["-t", f"{PREFIX}/call/echo", "-e", f"{PREFIX}/reply/bench", "-m", RR_ARGUMENTS]
    for _ in range(calls):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.DEVNULL)
        if await process.wait() != 0:
            raise SystemExit(f"mosquitto_rr exited with {process.returncode}")
        took.append((time.perf_counter() - started) * 1000)
    return took


def line(label: str, took: list[float]) -> str:
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, round(len(ordered) * 0.99))]
    return f"{label:<45} p50 {statistics.median(took):6.2f} ms   p99 {p99:6.2f} ms"


async def measure(calls: int) -> list[str]:
    out = [f"{calls} sequential echo calls each, in-process worker, private mosquitto"]
    for nodelay in (True, False):
        with private_broker(nodelay=nodelay) as broker:
            url, port = broker.url, int(broker.url.rpartition(":")[2])
            settings = Settings.model_validate(
                {
                    "broker_url": url,
                    "topic_prefix": PREFIX,
                    "worker_id": "bench-nodelay",
                    "log_level": "WARNING",
                }
            )
            async with build_worker(settings, BUILTIN_TOOLS):
                setting = f"set_tcp_nodelay {'true' if nodelay else 'false'}"
                out.append(line(f"{setting}: one toolbus.Client", await kept(url, calls)))
                out.append(line(f"{setting}: mosquitto_rr", await rr(port, calls)))
                out.append(
                    line(f"{setting}: mosquitto_rr --nodelay", await rr(port, calls, "--nodelay"))
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    if shutil.which("mosquitto_rr") is None:
        raise SystemExit("mosquitto_rr not found: scripts/ensure-mosquitto --clients")
    print("\n".join(asyncio.run(measure(args.calls))))


if __name__ == "__main__":
    main()
