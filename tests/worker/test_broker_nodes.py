"""A list of brokers (`broker_url` with several nodes): the worker connects to the first,
and when that node is lost moves to the next, where its status lands and its calls are
answered. Two real mosquittos stand for two nodes (each its own: a caller on the node the
worker left gets nothing until it moves too, as on a cluster whose node died)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import RenderableType

from tests.cli.test_cli import cli_env, run_cli
from tests.support.harness import Broker, free_port, make_settings, measured, running_worker
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.relay import Relay
from toolbus import Client
from toolbus.cli import status_view
from toolbus.client.client import Retry
from toolbus.client.pool import Pool
from toolbus.config import BrokerUrl
from toolbus.wire.contracts import WorkerStatus
from toolbus.wire.topics import Topics

WAIT_S = 30.0


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first, second = Broker(tmp_path / "a"), Broker(tmp_path / "b")
    first.start()
    second.start()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


async def test_the_worker_moves_to_the_next_node_when_its_node_is_lost(
    nodes: tuple[Broker, Broker],
) -> None:
    first, second = nodes
    settings = make_settings(first, broker_url=[first.url, second.url], reconnect_max_delay_s=1.0)
    async with running_worker(settings) as worker:
        reply = reply_topic_for(worker.topics)
        async with Caller(first.url) as on_first:
            answer, _ = await on_first.call(
                f"{worker.topics.call}/echo", {"arguments": {"text": "a"}}, reply_topic=reply
            )
        assert answer["ok"] is True
        async with Caller(second.url) as on_second:
            await on_second.subscribe(worker.topics.status(worker.worker_id))
            lost_at = time.monotonic()
            first.kill()
            async with asyncio.timeout(WAIT_S):  # its status lands on the second node
                while True:
                    message = await on_second.next_message(WAIT_S)
                    status = json.loads(message.payload)
                    if status.get("state") == "online":
                        break
            assert status["broker"] == f"127.0.0.1:{second.port}"  # and names that node
            moved_s = time.monotonic() - lost_at
            answer, _ = await on_second.call(
                f"{worker.topics.call}/echo", {"arguments": {"text": "b"}}, reply_topic=reply
            )
        assert answer["ok"] is True and answer["result"]["structured"]["text"] == "b"
    measured(f"worker moved to the next broker node after its node was killed: {moved_s:.2f} s")


def test_a_list_of_brokers_is_read_from_a_list_or_commas(broker: Broker) -> None:
    listed = make_settings(broker, broker_url=["mqtt://a:1883", "mqtt://b:1884"])
    commas = make_settings(broker, broker_url="mqtt://a:1883, mqtt://b:1884")
    for settings in (listed, commas):
        assert [(b.host, b.port) for b in settings.brokers] == [("a", 1883), ("b", 1884)]
        assert settings.broker == settings.brokers[0]


async def test_a_client_and_the_cli_use_the_first_node_that_answers_and_follow_a_loss(
    nodes: tuple[Broker, Broker], broker: Broker
) -> None:
    """`toolbus.Client` given both nodes: the first is down, so it connects to the second;
    `toolbus status` reads the statuses there and says which node it read. Then the
    worker's node dies: the worker and the client both move on, and a call still goes."""
    first, second = nodes
    dead = f"mqtt://127.0.0.1:{free_port()}"  # nobody listens there
    settings = make_settings(first, broker_url=[first.url, second.url], reconnect_max_delay_s=1.0)
    async with running_worker(settings) as worker:
        env = cli_env(worker.topics.prefix)
        code, _, err = await run_cli("status", "--once", "--broker", f"{dead},{first.url}", env=env)
        assert code == 0, err
        assert f"statuses read from {first.url}" in err
        client = Client([first.url, second.url], prefix=worker.topics.prefix, timeout_s=WAIT_S)
        async with client:
            first_answer = (await client.call("echo", {"text": "a"})).result
            assert first_answer is not None
            assert first_answer.structured == {"text": "a", "data": None}
            first.kill()
            # The call is sent again (the client's retries) until a worker answers on the
            # node both moved to.
            moved = await client.call("echo", {"text": "b"})
        assert moved.result is not None and moved.result.structured == {"text": "b", "data": None}
        assert client.connects >= 2


async def test_a_client_connects_to_the_first_node_that_answers(
    nodes: tuple[Broker, Broker],
) -> None:
    _, second = nodes
    dead = f"mqtt://127.0.0.1:{free_port()}"
    settings = make_settings(second)
    async with running_worker(settings) as worker:
        client = Client(f"{dead},{second.url}", prefix=worker.topics.prefix, timeout_s=WAIT_S)
        async with client:
            answer = await client.call("echo", {"text": "x"})
    assert answer.result is not None and answer.result.structured == {"text": "x", "data": None}


async def test_the_live_status_view_reads_the_first_node_that_answers_and_names_it(
    nodes: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`toolbus status` (the live view) given a silent node first: it reads the next, says
    which node it reads, and each worker's row names the node the worker is on."""
    first, _ = nodes
    drawn: list[tuple[list[WorkerStatus], str]] = []
    seen = asyncio.Event()
    real_render = status_view.render

    def render(pool: Pool, topics: Topics, note: str = "") -> RenderableType:
        drawn.append((pool.workers(), note))
        if any(w.state == "online" for w in pool.workers()):
            seen.set()
        return real_render(pool, topics, note)

    monkeypatch.setattr(status_view, "render", render)
    # A node that takes the TCP connection and never answers MQTT: given up on after the
    # timeout, then the next node is read (not the whole view given up on).
    silent = socket.create_server(("127.0.0.1", 0))
    dead = BrokerUrl.from_url(f"mqtt://127.0.0.1:{silent.getsockname()[1]}")
    settings = make_settings(first)
    async with running_worker(settings) as worker:
        viewing = asyncio.create_task(
            status_view.live((dead, settings.broker), worker.topics, 2.0), name="live-view"
        )
        try:
            async with asyncio.timeout(WAIT_S):
                await seen.wait()
        finally:
            viewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await viewing
            silent.close()
    workers, note = next((w, n) for w, n in drawn if any(x.state == "online" for x in w))
    assert note == f"statuses read from {first.url}"
    assert [w.broker for w in workers] == [f"127.0.0.1:{first.port}"]


async def test_a_client_leaves_a_node_that_stalls_within_its_keepalive(broker: Broker) -> None:
    """A node that stalls without closing the connection (a partition: the relay holds
    every byte): a `Client` with `keepalive_s = 1` gives it up within a few seconds and
    its re-send is answered through the next node; with the 60 s default it would wait."""
    relay = Relay("127.0.0.1", broker.port)
    await relay.start()
    try:
        async with running_worker(make_settings(broker)) as worker:
            client = Client(
                [relay.url, broker.url],
                prefix=worker.topics.prefix,
                timeout_s=WAIT_S,
                keepalive_s=1,
                retry=Retry(attempts=10, interval_s=1.0),
            )
            async with client:
                before = await client.call("echo", {"text": "a"})
                assert before.result is not None and client.connects == 1
                await relay.partition()
                stalled_at = time.monotonic()
                after = await client.call("echo", {"text": "b"})
                moved_s = time.monotonic() - stalled_at
        assert after.result is not None and after.result.structured == {"text": "b", "data": None}
        assert client.connects == 2  # the stalled node left for the next
        assert moved_s < 10.0  # a few keepalives, not the 60 s default's 90
    finally:
        await relay.stop()
    measured(f"client left a stalled node (keepalive_s = 1) and was answered in {moved_s:.2f} s")
