"""Connecting has one deadline: a host that accepts TCP but never answers MQTT fails in time.

The stand-in for an unreachable broker is deterministic: a listening socket that
accepts connections and never says a word (a black-holed address behaves the same
once the kernel's SYN retries are bounded by the same deadline). The connection given
up on is closed, not left open for the life of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.cli.test_cli import cli_env, run_cli
from tests.support.harness import Broker, free_port
from toolbus.client.client import Client
from toolbus.transport import MqttConnection, TransportError
from toolbus.wire.broker import BrokerUrl
from toolbus.worker.exit_codes import EXIT_BROKER

TIMEOUT_S = 1.0
SLACK_S = 0.5  # scheduling on a loaded machine; far below paho's own 5 s bounds


class Silent:
    """A TCP listener that accepts and reads, never answers; it sees each close.
    Given a broker port, it relays to that broker instead (and still sees the close)."""

    def __init__(self, relay_to: int | None = None) -> None:
        self.port = 0
        self.relay_to = relay_to
        self.closed: asyncio.Queue[bytes] = asyncio.Queue()  # what each connection sent

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sent = bytearray()
        try:
            if self.relay_to is None:
                sent += await reader.read()  # until the client closes
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.relay_to)
            back = asyncio.create_task(_pipe(up_reader, writer, bytearray()))
            await _pipe(reader, up_writer, sent)
            back.cancel()
            up_writer.close()
        finally:
            writer.close()
            await self.closed.put(bytes(sent))


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: bytearray
) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(4096):
            seen += chunk
            writer.write(chunk)
            await writer.drain()


@contextlib.asynccontextmanager
async def listening(relay_to: int | None = None) -> AsyncIterator[Silent]:
    listener = Silent(relay_to)
    server = await asyncio.start_server(listener._serve, "127.0.0.1", 0)
    listener.port = server.sockets[0].getsockname()[1]
    async with server:
        yield listener
        server.close()


@pytest_asyncio.fixture
async def silent() -> AsyncIterator[Silent]:
    async with listening() as listener:
        yield listener


@pytest.mark.parametrize("scheme", ["mqtt", "mqtts"])
async def test_connect_fails_within_its_timeout_and_closes_the_socket(
    silent: Silent, scheme: str
) -> None:
    client = Client(f"{scheme}://127.0.0.1:{silent.port}", connect_timeout_s=TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(TransportError):
        async with client:
            pass
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S
    async with asyncio.timeout(TIMEOUT_S + SLACK_S):
        await silent.closed.get()  # the half-made connection is not left open


async def test_call_to_a_silent_host_exits_within_its_timeout(silent: Silent) -> None:
    env = cli_env("unreached")
    refused = f"mqtt://127.0.0.1:{free_port()}"
    for command in (("call", "echo", "text=x"), ("tools",)):
        # The same command against a closed port fails at once: its run time is the
        # process's start-up, which varies by seconds on a loaded machine. Hence the
        # slack; a connect --timeout did not reach would take 10 s, paho's bound 5 s.
        started = time.monotonic()
        code, _, _ = await run_cli(*command, "--timeout", "1", "--broker", refused, env=env)
        baseline_s = time.monotonic() - started
        assert code == EXIT_BROKER
        started = time.monotonic()
        code, _, err = await run_cli(
            *command, "--timeout", "1", "--broker", f"mqtt://127.0.0.1:{silent.port}", env=env
        )
        assert code == EXIT_BROKER, err
        assert time.monotonic() - started - baseline_s < TIMEOUT_S + 3.0, command
        assert len(err.splitlines()) == 1  # one readable line, no traceback


async def test_a_connection_made_after_the_deadline_is_closed(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket phase runs in a thread no deadline stops: one that connects after we
    gave up must not stay connected (and keep a session) for the life of the process."""
    import paho.mqtt.client as paho

    connect = paho.Client.connect

    def slow_connect(client: paho.Client, *args: object, **kwargs: object) -> object:
        time.sleep(TIMEOUT_S + SLACK_S)  # a slow network, in paho's connect thread
        return connect(client, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paho.Client, "connect", slow_connect)
    async with listening(relay_to=broker.port) as relay:
        url = BrokerUrl.from_url(f"mqtt://127.0.0.1:{relay.port}")
        started = time.monotonic()
        with pytest.raises(TransportError):
            async with MqttConnection(url, timeout_s=TIMEOUT_S):
                pass
        assert time.monotonic() - started < TIMEOUT_S + SLACK_S
        async with asyncio.timeout(4 * TIMEOUT_S):
            sent = await relay.closed.get()  # connected late, then closed by us
        assert sent[0] >> 4 == 1 and sent[-2:] == bytes([0xE0, 0])  # CONNECT ... DISCONNECT


async def test_a_connection_closed_before_its_connack_fails_at_once() -> None:
    """A listener that reads the CONNECT and closes (a broker going down, a proxy with no
    backend, a partition the keepalive gave up on before the CONNACK) ends the attempt
    when the socket closes, not at the deadline: aiomqtt alone would wait for a CONNACK
    its full timeout, and a worker cut off for a few seconds rejoined 10 s late."""

    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    url = BrokerUrl.from_url(f"mqtt://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    deadline_s = 10.0
    try:
        started = time.monotonic()
        with pytest.raises(TransportError):
            async with MqttConnection(url, timeout_s=deadline_s):
                pass
        assert time.monotonic() - started < 1 + SLACK_S
    finally:
        server.close()
