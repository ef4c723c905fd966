"""Connecting has one deadline: a host that accepts TCP but never answers MQTT fails in time.

The stand-in for an unreachable broker is deterministic: a listening socket that
accepts connections and never says a word (a black-holed address behaves the same
once the kernel's SYN retries are bounded by the same deadline). The connection given
up on is closed, not left open for the life of the process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.harness import free_port
from tests.test_cli import cli_env, run_cli
from toolbus.cli import EXIT_BROKER
from toolbus.client import Client
from toolbus.transport import TransportError

TIMEOUT_S = 1.0
SLACK_S = 0.5  # scheduling on a loaded machine; far below paho's own 5 s bounds


class Silent:
    """A TCP listener that accepts and reads, never answers; it sees each close."""

    def __init__(self) -> None:
        self.port = 0
        self.closed: asyncio.Queue[bytes] = asyncio.Queue()  # what each connection sent

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.closed.put(await reader.read())  # until the client closes
        finally:
            writer.close()


@pytest_asyncio.fixture
async def silent() -> AsyncIterator[Silent]:
    listener = Silent()
    server = await asyncio.start_server(listener._serve, "127.0.0.1", 0)
    listener.port = server.sockets[0].getsockname()[1]
    async with server:
        yield listener
        server.close()


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
    # The same command against a closed port fails at once: its run time is the
    # process's own start-up, which the bound below adds to the timeout.
    started = time.monotonic()
    refused = f"mqtt://127.0.0.1:{free_port()}"
    code, _, _ = await run_cli("call", "echo", "--timeout", "1", "--broker", refused, env=env)
    baseline_s = time.monotonic() - started
    assert code == EXIT_BROKER
    for command in (("call", "echo", "text=x"), ("tools",)):
        started = time.monotonic()
        code, _, err = await run_cli(
            *command, "--timeout", "1", "--broker", f"mqtt://127.0.0.1:{silent.port}", env=env
        )
        assert code == EXIT_BROKER, err
        assert time.monotonic() - started < baseline_s + TIMEOUT_S + 1.0, command
        assert len(err.splitlines()) == 1  # one readable line, no traceback
