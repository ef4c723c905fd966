"""A connection whose socket reader fails is dropped, and its message stream ends.

paho raises out of `loop_read` when it cannot deliver a packet it read (a PUBLISH whose
topic is not UTF-8: aiomqtt's `on_message` fails reading it), and handles that packet
again on every later `loop_read`; aiomqtt ends its stream with the error but leaves the
socket open and its reader registered. The connection now stops reading and sends a
DISCONNECT 0x04 (the broker publishes its Will, as for a connection lost); a reader of
`messages()` (toolbus.Client's replies, the bench) sees `TransportError`, never waits for
ever, and no reader spins on the socket. The stand-in broker is scripted: mosquitto
never sends such a topic.
"""

from __future__ import annotations

import asyncio

import pytest

from toolbus.transport import MqttConnection, TransportError
from toolbus.transport.socket_reader import paho_of
from toolbus.wire.broker import BrokerUrl

BAD_TOPIC = b"\xff\xfe"  # not UTF-8


def _publish(topic: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + b"\x00" + b"x"  # QoS 0, no properties
    return bytes([0x30, len(body)]) + body


class _Broker:
    """CONNACK; once the client subscribed (it is reading), a good PUBLISH if `good_first`
    and a bad one; then what the client says next (`said`, `heard`)."""

    def __init__(self, good_first: bool) -> None:
        self.good_first = good_first
        self.said = b""
        self.heard = asyncio.Event()
        self.done = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)  # the CONNECT
        writer.write(bytes([0x20, 3, 0, 0, 0]))  # CONNACK v5: accepted, no properties
        await writer.drain()
        await reader.read(4096)  # the SUBSCRIBE: the client is connected and reading
        writer.write((_publish(b"t") if self.good_first else b"") + _publish(BAD_TOPIC))
        await writer.drain()
        self.said = await reader.read(4096)  # the client's DISCONNECT
        self.heard.set()
        await self.done.wait()  # the socket stays open until the test is done
        writer.close()


async def _read_all(conn: MqttConnection) -> None:
    async with asyncio.timeout(5):  # the stream used to wait for ever
        async for _ in conn.messages():
            pass


# Loop turns after the stand-in broker closed its end: a reader left registered on the
# socket would handle the bad PUBLISH again in each (an ERROR line a turn, 19 000 of
# them across the next test file once; one such file's TLS connect then timed out).
WATCHED_TURNS = 200


@pytest.mark.parametrize(
    ("hold", "good_first"),
    [(None, False), (4, False), (1, True)],
    # bounded-reader-paused: the good message is held, so the bad one is read by the
    # paused reader's keepalive probe (every keepalive / 4)
    ids=["aiomqtt-reader", "bounded-reader", "bounded-reader-paused"],
)
async def test_a_failed_read_drops_the_connection_and_ends_the_stream(
    hold: int | None, good_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    script = _Broker(good_first)
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        broker = BrokerUrl.from_url(f"mqtt://127.0.0.1:{port}")
        async with MqttConnection(broker, timeout_s=2, hold=hold, keepalive_s=2) as conn:
            inner = paho_of(conn._client)
            inner.subscribe("t")  # the broker's cue (it sends no SUBACK)
            async with asyncio.timeout(5):
                await script.heard.wait()  # dropped with nobody reading the stream
            with pytest.raises(TransportError) as ended:
                await _read_all(conn)  # the good message, if any, then the end
        script.done.set()  # the stand-in broker closes its end: the socket reads as ended
        for _ in range(WATCHED_TURNS):
            await asyncio.sleep(0)  # a window of loop turns, not a wait for anything
    assert script.said == bytes([0xE0, 1, 0x04])  # DISCONNECT, "with will message"
    assert conn.read_pauses == (1 if good_first else 0)  # paused: the probe read it
    assert inner.socket() is None  # paho closed it after its DISCONNECT
    handled = [r for r in caplog.records if "on_message" in r.getMessage()]
    assert len(handled) == 1, len(handled)  # the bad PUBLISH handled once, never again
    if hold is None:
        # Chained from paho's error, as aiomqtt's iterator did: retrieved, so never
        # logged as "Future exception was never retrieved".
        assert isinstance(ended.value.__cause__, UnicodeDecodeError)
