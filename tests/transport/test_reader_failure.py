"""A connection whose socket reader fails ends its message stream, as aiomqtt's did.

paho raises out of `loop_read` when it cannot deliver a packet it read (a PUBLISH whose
topic is not UTF-8: aiomqtt's `on_message` fails reading it). aiomqtt then ends its
stream with the error, and paho's `on_disconnect` never runs; a reader of `messages()`
(toolbus.Client's replies, the bench) must see `TransportError`, not wait for ever. The
stand-in broker is scripted: mosquitto never sends such a topic.
"""

from __future__ import annotations

import asyncio

import pytest

from toolbus.transport import MqttConnection, TransportError
from toolbus.transport.socket_reader import paho_of
from toolbus.wire.broker import BrokerUrl

BAD_TOPIC = b"\xff\xfe"  # not UTF-8


async def _broker(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, done: asyncio.Event
) -> None:
    """CONNACK, then (once the client has read it: it asks nothing more) a bad PUBLISH."""
    await reader.read(4096)  # the CONNECT
    writer.write(bytes([0x20, 3, 0, 0, 0]))  # CONNACK v5: accepted, no properties
    await writer.drain()
    await reader.read(4096)  # the SUBSCRIBE: the client is connected and reading
    body = len(BAD_TOPIC).to_bytes(2, "big") + BAD_TOPIC + b"\x00" + b"x"  # QoS 0
    writer.write(bytes([0x30, len(body)]) + body)
    await writer.drain()
    await done.wait()  # the socket stays open: only the reader's failure ends the stream
    writer.close()


async def _read_all(conn: MqttConnection) -> None:
    async with asyncio.timeout(5):  # the stream used to wait for ever
        async for _ in conn.messages():
            pass


# Loop turns after the stand-in broker closed its end: a reader left registered on the
# socket would handle the bad PUBLISH again in each (an ERROR line a turn, 19 000 of
# them across the next test file once; one such file's TLS connect then timed out).
WATCHED_TURNS = 200


@pytest.mark.parametrize("hold", [None, 4], ids=["aiomqtt-reader", "bounded-reader"])
async def test_messages_end_when_the_reader_fails(
    hold: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    done = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: _broker(r, w, done), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        broker = BrokerUrl.from_url(f"mqtt://127.0.0.1:{port}")
        async with MqttConnection(broker, timeout_s=2, hold=hold) as conn:
            inner = paho_of(conn._client)
            inner.subscribe("t")  # the broker's cue (it sends no SUBACK)
            with pytest.raises(TransportError) as ended:
                await _read_all(conn)
        done.set()  # the stand-in broker closes its end: the socket reads as ended
        for _ in range(WATCHED_TURNS):
            await asyncio.sleep(0)  # a window of loop turns, not a wait for anything
    assert inner.socket() is None  # dropped: paho closed it after its DISCONNECT
    handled = [r for r in caplog.records if "on_message" in r.getMessage()]
    assert len(handled) == 1, len(handled)  # the bad PUBLISH handled once, never again
    if hold is None:
        # Chained from paho's error, as aiomqtt's iterator did: retrieved, so never
        # logged as "Future exception was never retrieved".
        assert isinstance(ended.value.__cause__, UnicodeDecodeError)
