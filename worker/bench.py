"""Benchmark: round trips through a real worker, against a baseline from the same run.

`toolbus bench` starts two private mosquitto brokers (one with `set_tcp_nodelay`,
one without), runs an in-process worker with the demo MCP server against each,
and prints latency and throughput side by side. The baseline is the same worker
with Nagle's algorithm left on at every hop, which is what this project refuses
to ship: the ratio shows what TCP_NODELAY buys on this machine.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from toolbus.broker import BrokerUrl
from toolbus.config import Settings
from toolbus.messages import Outbound
from toolbus.service import Worker
from toolbus.tools import BUILTIN_TOOLS
from toolbus.transport import MqttConnection
from toolbus.wiring import build_worker

BROKER_START_S = 10.0
REPLY_TIMEOUT_S = 30.0
DEMO_ARGS = ["-m", "toolbus", "demo-server"]


@dataclass(frozen=True, slots=True)
class Figures:
    label: str
    local_p50_ms: float
    local_p99_ms: float
    mcp_p50_ms: float
    throughput_rps: float


@contextmanager
def private_broker(*, tcp_nodelay: bool) -> Iterator[str]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"set_tcp_nodelay {'true' if tcp_nodelay else 'false'}\n"
        )
        proc = subprocess.Popen(  # noqa: S603 -- our own binary and config
            [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + BROKER_START_S
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("mosquitto did not start") from None
                    time.sleep(0.02)
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


class _Requester:
    """Publishes requests and matches replies by correlation data."""

    def __init__(self, conn: MqttConnection, reply_topic: str) -> None:
        self.conn = conn
        self.reply_topic = reply_topic
        self.pending: dict[bytes, asyncio.Future[dict[str, Any]]] = {}

    async def pump(self) -> None:
        async for message in self.conn.messages():
            future = self.pending.pop(message.correlation_data or b"", None)
            if future is not None and not future.done():
                future.set_result(json.loads(message.payload))

    async def call(self, topic: str, body: dict[str, Any]) -> float:
        correlation = uuid.uuid4().bytes
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[correlation] = future
        started = time.perf_counter()
        await self.conn.publish(
            Outbound(
                topic=topic,
                payload=json.dumps(body).encode(),
                response_topic=self.reply_topic,
                correlation_data=correlation,
            )
        )
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            reply = await future
        if not reply.get("ok"):
            raise RuntimeError(f"benchmark call failed: {reply}")
        return (time.perf_counter() - started) * 1000


@asynccontextmanager
async def _worker(url: str, *, tcp_nodelay: bool) -> AsyncIterator[Worker]:
    settings = Settings.model_validate(
        {
            "broker_url": url,
            "topic_prefix": "bench",
            "log_level": "WARNING",
            "mcpServers": {"devices": {"command": sys.executable, "args": DEMO_ARGS}},
        }
    )
    async with build_worker(settings, BUILTIN_TOOLS, tcp_nodelay=tcp_nodelay) as worker:
        async with asyncio.timeout(60):
            await worker.mcp.wait_settled()
        yield worker


async def measure(
    label: str, url: str, *, tcp_nodelay: bool, requests: int, concurrency: int
) -> Figures:
    async with _worker(url, tcp_nodelay=tcp_nodelay) as worker:
        reply_topic = f"{worker.topics.reply_prefixes[0]}bench"
        conn = MqttConnection(BrokerUrl.from_url(url), tcp_nodelay=tcp_nodelay)
        async with conn:
            await conn.subscribe([reply_topic])
            requester = _Requester(conn, reply_topic)
            pump = asyncio.create_task(requester.pump(), name="bench-replies")
            echo = f"{worker.topics.call}/echo"
            body = {"arguments": {"text": "benchmark"}}
            for _ in range(20):  # warm-up
                await requester.call(echo, body)
            local = [await requester.call(echo, body) for _ in range(requests)]
            mcp_topic = f"{worker.topics.call}/get_device_sensor_data"
            mcp_body = {"arguments": {"device_name": "Hallway Sensor"}}
            mcp = [await requester.call(mcp_topic, mcp_body) for _ in range(max(requests // 2, 10))]
            slots = asyncio.Semaphore(concurrency)

            async def bounded() -> float:
                async with slots:
                    return await requester.call(echo, body)

            started = time.perf_counter()
            await asyncio.gather(*(bounded() for _ in range(requests * 4)))
            throughput = requests * 4 / (time.perf_counter() - started)
            pump.cancel()
    local.sort()
    return Figures(
        label=label,
        local_p50_ms=statistics.median(local),
        local_p99_ms=local[min(len(local) - 1, int(len(local) * 0.99))],
        mcp_p50_ms=statistics.median(mcp),
        throughput_rps=throughput,
    )


def run(requests: int = 200, concurrency: int = 64) -> list[Figures]:
    results = []
    for label, nodelay in (("TCP_NODELAY (shipped)", True), ("Nagle on (baseline)", False)):
        with private_broker(tcp_nodelay=nodelay) as url:
            figures = measure(
                label, url, tcp_nodelay=nodelay, requests=requests, concurrency=concurrency
            )
            results.append(asyncio.run(figures))
    return results


def render(results: list[Figures]) -> None:
    _table(
        "QoS 1 round trips through one worker (sequential unless noted)",
        results,
        "baseline/shipped",
    )


def _table(title: str, results: list[Figures], ratio_label: str) -> None:
    """The figures side by side; the ratio row compares the second to the first."""
    table = Table(title=title)
    columns = ("", "echo p50 ms", "echo p99 ms", "MCP tool p50 ms", "echo req/s (64 in flight)")
    for column in columns:
        table.add_column(column, justify="right" if column else "left")
    for f in results:
        table.add_row(
            f.label,
            f"{f.local_p50_ms:.2f}",
            f"{f.local_p99_ms:.2f}",
            f"{f.mcp_p50_ms:.2f}",
            f"{f.throughput_rps:.0f}",
        )
    first, second = results
    table.add_row(
        ratio_label,
        f"{second.local_p50_ms / first.local_p50_ms:.2f}x",
        f"{second.local_p99_ms / first.local_p99_ms:.2f}x",
        f"{second.mcp_p50_ms / first.mcp_p50_ms:.2f}x",
        f"{second.throughput_rps / first.throughput_rps:.2f}x",
    )
    Console().print(table)


class _OtlpSink(BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP exports and drops them: a receiver that costs the worker nothing."""

    received = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


def run_tracing(requests: int = 300, concurrency: int = 64) -> list[Figures]:
    """The same run with tracing off, then on (batch OTLP export to a local sink)."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    results = []
    with private_broker(tcp_nodelay=True) as url:
        off = measure(
            "tracing off", url, tcp_nodelay=True, requests=requests, concurrency=concurrency
        )
        results.append(asyncio.run(off))
        sink = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
        thread = threading.Thread(target=sink.serve_forever, name="otlp-sink", daemon=True)
        thread.start()
        try:
            provider = TracerProvider()
            endpoint = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
            trace.set_tracer_provider(provider)
            on = measure(
                "tracing on (OTLP)",
                url,
                tcp_nodelay=True,
                requests=requests,
                concurrency=concurrency,
            )
            results.append(asyncio.run(on))
            provider.shutdown()
        finally:
            sink.shutdown()
    if _OtlpSink.received == 0:
        raise RuntimeError("no spans reached the local OTLP receiver: tracing was not on")
    return results


def render_tracing(results: list[Figures]) -> None:
    _table("Tracing overhead: the same worker, tracing off vs on, one run", results, "on / off")
