"""Client latency: sequential `echo` calls on one `toolbus.Client` against a new one per call.

Run: `make bench-client` or `.venv/bin/python bench/client_latency.py [--calls N]`. A
private mosquitto on a free loopback port (TCP_NODELAY, as shipped) and an in-process
worker with the built-in tools; the same calls made one after another, first all on one
client (one connection, one reply subscription), then each on a client of its own
(connect, subscribe, call, disconnect), as `toolbus call` does per invocation. The
baseline is the bare round trip on one connection (publish, await the reply by
correlation; no retries, no parsing into models): what the client itself costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus import BrokerUrl, Client
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.cli.bench.mosquitto import private_broker
from toolbus.config import Settings
from toolbus.transport import MqttConnection
from toolbus.wire.messages import Outbound
from toolbus.worker.wiring import build_worker

PREFIX = "bench"


async def bare(url: str, calls: int) -> list[float]:
    took: list[float] = []
    reply_topic = f"{PREFIX}/reply/bare"
    async with MqttConnection(BrokerUrl.from_url(url)) as connection:
        await connection.subscribe([reply_topic])
        replies = connection.messages()
        for n in range(-1, calls):  # one to warm up
            body = {"id": uuid.uuid4().hex, "tool": "echo", "arguments": {"text": str(n)}}
            started = time.perf_counter()
            await connection.publish(
                Outbound(
                    topic=f"{PREFIX}/call",
                    payload=json.dumps(body).encode(),
                    response_topic=reply_topic,
                    correlation_data=body["id"].encode(),
                )
            )
            async with asyncio.timeout(30):
                answer = await anext(replies)
            assert answer.correlation_data == body["id"].encode()
            if n >= 0:
                took.append((time.perf_counter() - started) * 1000)
    return took


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
    with private_broker() as broker:
        url = broker.url
        settings = Settings.model_validate(
            {
                "broker_url": url,
                "topic_prefix": PREFIX,
                "worker_id": "bench-client",
                "log_level": "WARNING",
            }
        )
        async with build_worker(settings, BUILTIN_TOOLS):
            baseline = await bare(url, calls)
            one = await kept(url, calls)
            each = await fresh(url, calls)
    ratio = statistics.median(each) / statistics.median(one)
    return [
        f"{calls} sequential echo calls, in-process worker, private mosquitto",
        line("bare round trip (baseline)", baseline),
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
