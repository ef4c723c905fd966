"""Fixtures: a real mosquitto on a free loopback port, workers, MQTT callers, dedup stores.

The helpers behind them live in `tests/support/harness.py`; import those from there.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from tests.support.harness import (
    DEMO_SERVER,
    MEASUREMENTS,
    SPAN_ENDS,
    Broker,
    RedisServer,
    make_settings,
    running_worker,
)
from tests.support.mqtt import Caller
from tests.support.otlp import OtlpReceiver, otlp_receiver
from tests.support.redis_ha import Cluster
from toolbus.dedup import DedupStore, open_store
from toolbus.dedup.redis import RedisStore

if TYPE_CHECKING:
    from toolbus.worker.service import Worker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(tmp_path_factory.mktemp("mosquitto"))
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A three-node Redis Cluster (`redis+cluster://`), shared by the tests that read it."""
    cluster = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest_asyncio.fixture(params=["memory", "redis", "cluster"])
async def store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[DedupStore]:
    """One worker's dedup store as production opens it (`open_store`), memory, Redis and a
    Redis Cluster: the rules every store keeps."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    url = {"memory": "memory", "redis": redis_server.url}.get(request.param)
    if url is None:
        url = request.getfixturevalue("redis_cluster").url
    opened = open_store(url, "w1", prefix=prefix)
    async with opened:
        yield opened


@pytest_asyncio.fixture
async def workers(redis_server: RedisServer) -> AsyncIterator[Callable[[str], RedisStore]]:
    """Opened RedisStores of one fleet (one prefix), by worker id."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    opened: list[RedisStore] = []

    def make(worker_id: str) -> RedisStore:
        opened.append(RedisStore(redis_server.url, worker_id, prefix=prefix))
        return opened[-1]

    yield make
    for s in opened:
        await s.__aexit__(None, None, None)


@pytest_asyncio.fixture(scope="module")
async def collector() -> AsyncIterator[OtlpReceiver]:
    """An OTLP/HTTP receiver standing in for a collector, one per test module."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, to freeze or restart (empty: it saves nothing)."""
    server = RedisServer()
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.process.send_signal(signal.SIGCONT)  # a test that froze it and failed
    server.stop()


@pytest_asyncio.fixture(scope="session")
async def demo_worker(broker: Broker) -> AsyncIterator[Worker]:
    """One worker with the demo MCP device server, shared by the tests that only call."""
    settings = make_settings(broker, mcpServers={"devices": DEMO_SERVER})
    async with running_worker(settings) as worker:
        assert worker.mcp.states() == {"devices": "ready"}
        yield worker


@pytest_asyncio.fixture
async def caller(broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url, v5=True) as c:
        yield c


@pytest_asyncio.fixture
async def caller311(broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url, v5=False) as c:
        yield c


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASUREMENTS:
        terminalreporter.section("measured (not asserted)")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def spans() -> Any:
    """Every span of the session, in memory (the global provider can be set only once).

    Tests find their own spans by trace id.
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from toolbus.observability.export import COLLECTOR

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(COLLECTOR)  # as configure_tracing does
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SPAN_ENDS)  # after the exporter: a woken test sees the span
    trace.set_tracer_provider(provider)
    return exporter
