"""The bare aiomqtt echo responder: what the transport alone costs, in its own process.

    python -m toolbus.bench.aiomqtt_echo --broker mqtt://127.0.0.1:1883 --topic bench/call/echo

One aiomqtt MQTT v5 client (TCP_NODELAY, as the worker's) subscribes at QoS 1 to the
call topic the worker would serve (no shared subscription); for each message it
`json.loads` the payload and publishes `{"ok": true, "result": ...}` to the message's
Response Topic with its Correlation Data, QoS 1. Messages are answered one after
another, each publish awaited to its PUBACK: the loop a user would write first, and
the floor toolbus is compared against. It prints `ready` once subscribed and runs
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
from urllib.parse import urlsplit

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

READY = "ready"
_NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


async def serve(host: str, port: int, topic: str) -> None:
    async with aiomqtt.Client(
        host,
        port,
        protocol=aiomqtt.ProtocolVersion.V5,
        socket_options=_NODELAY,
        max_inflight_messages=1000,  # paho's default of 20 would throttle the replies
    ) as client:
        await client.subscribe(topic, qos=1)
        sys.stdout.write(READY + "\n")
        sys.stdout.flush()
        async for message in client.messages:
            request = message.properties
            reply_topic = getattr(request, "ResponseTopic", None)
            if reply_topic is None or not isinstance(message.payload, bytes | bytearray):
                continue
            body = json.loads(message.payload)
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = getattr(request, "CorrelationData", b"")
            result = body.get("arguments") if isinstance(body, dict) else None
            reply = json.dumps({"ok": True, "result": result})
            await client.publish(reply_topic, reply, qos=1, properties=props)


async def run(host: str, port: int, topic: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = asyncio.create_task(serve(host, port, topic), name="echo")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    await asyncio.wait({server, stopping}, return_when=asyncio.FIRST_COMPLETED)
    for task in (server, stopping):
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await server  # an error of the responder's own is raised here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True, help="mqtt://host:port")
    parser.add_argument("--topic", required=True)
    args = parser.parse_args(argv)
    url = urlsplit(args.broker)
    asyncio.run(run(url.hostname or "127.0.0.1", url.port or 1883, args.topic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
