"""Client latency: sequential `echo` calls on one `toolbus.Client` against a new one per call.

Run: `make bench-client` or `.venv/bin/python bench/client_latency.py [--calls N]`. A
private mosquitto on a free loopback port (TCP_NODELAY, as shipped) and an in-process
worker with the built-in tools; the same calls made one after another, first all on one
client (one connection, one reply subscription), then each on a client of its own
(connect, subscribe, call, disconnect), as `toolbus call` does per invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus import Client
from toolbus.bench import private_broker
from toolbus.config import Settings
from toolbus.tools import BUILTIN_TOOLS
from toolbus.wiring import build_worker

PREFIX = "bench"


async def kept(url: str, calls: int) -> list[float]:
    took: list[float] = []
    async with Client(url, prefix=PREFIX) as client:
        await client.call("echo", {"text": "warm"})
        for n in range(calls):
            started = time.perf_counter()
            await client.call("echo", {"text": str(n)})
            took.append((time.perf_counter() - started) * 1000)
    return took


async def fresh(url: str, calls: int) -> list[float]:
    took: list[float] = []
    for n in range(calls):
        started = time.perf_counter()
        async with Client(url, prefix=PREFIX) as client:
            await client.call("echo", {"text": str(n)})
        took.append((time.perf_counter() - started) * 1000)
    return took


def line(label: str, took: list[float]) -> str:
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, round(len(ordered) * 0.99))]
    return f"{label:<28} p50 {statistics.median(took):6.2f} ms   p99 {p99:6.2f} ms"


async def measure(calls: int) -> list[str]:
    with private_broker(tcp_nodelay=True) as url:
        settings = Settings.model_validate(
            {
                "broker_url": url,
                "topic_prefix": PREFIX,
                "worker_id": "bench-client",
                "log_level": "WARNING",
            }
        )
        async with build_worker(settings, BUILTIN_TOOLS):
            one = await kept(url, calls)
            each = await fresh(url, calls)
    ratio = statistics.median(each) / statistics.median(one)
    return [
        f"{calls} sequential echo calls, in-process worker, private mosquitto",
        line("one Client, kept", one),
        line("a new Client per call", each),
        f"{'per call / kept':<28} {ratio:.1f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print("\n".join(asyncio.run(measure(args.calls))))


if __name__ == "__main__":
    main()
