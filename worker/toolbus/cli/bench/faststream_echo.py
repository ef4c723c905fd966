"""The FastStream echo responder: the framework a user might pick instead, in its own process.

    python -m toolbus.bench.faststream_echo --broker mqtt://127.0.0.1:1883 --topic bench/call/echo

One FastStream app (its MQTT broker, over zmqtt, MQTT 5.0) with one subscriber on the call
topic the worker would serve (QoS 1, no shared subscription, FastStream's default of one
message at a time). The handler is what FastStream's documentation writes: the body
decoded and validated by FastStream (`body: dict[str, Any]`), and `{"ok": true,
"result": ...}` returned as an `MQTTResponse` at QoS 1, which FastStream publishes to the
request's Response Topic with its Correlation Data (its RPC reply). FastStream's
per-message log lines are at DEBUG and its logger at WARNING: none is written, as
`toolbus serve` at WARNING writes no call line. It prints `ready` once subscribed and
runs until SIGTERM or SIGINT.

FastStream is optional (the `bench` and `dev` extras); `toolbus bench` skips this
responder, with a line, when it is not installed (`available`).
"""

# No `from __future__ import annotations`: FastStream reads the handler's annotations at
# run time (to decode the body and cast the return), and they name imports local to `app`.
import argparse
import importlib.util
import logging
import sys
from typing import Any
from urllib.parse import urlsplit

READY = "ready"


def available() -> bool:
    """Whether FastStream and its MQTT client (`faststream[mqtt]`) are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("faststream", "zmqtt"))


def app(host: str, port: int, topic: str) -> Any:
    """The FastStream application answering `topic` (imported here: FastStream is optional)."""
    from faststream import FastStream
    from faststream.mqtt import MQTTBroker, QoS
    from faststream.mqtt.response import MQTTResponse

    broker = MQTTBroker(
        f"mqtt://{host}:{port}",
        version="5.0",
        logger=_quiet_logger(),
        log_level=logging.DEBUG,  # its line per message, below the logger's level
    )

    @broker.subscriber(topic, qos=QoS.AT_LEAST_ONCE)
    async def echo(body: dict[str, Any]) -> MQTTResponse:
        return MQTTResponse({"ok": True, "result": body.get("arguments")}, qos=QoS.AT_LEAST_ONCE)

    application = FastStream(broker, logger=_quiet_logger())

    @application.after_startup
    def ready() -> None:
        sys.stdout.write(READY + "\n")
        sys.stdout.flush()

    return application


def _quiet_logger() -> logging.Logger:
    """FastStream's logger at WARNING: its connection and per-message lines are not written."""
    logger = logging.getLogger("toolbus.bench.faststream")
    logger.setLevel(logging.WARNING)
    return logger


def main(argv: list[str] | None = None) -> int:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True, help="mqtt://host:port")
    parser.add_argument("--topic", required=True)
    args = parser.parse_args(argv)
    url = urlsplit(args.broker)
    application = app(url.hostname or "127.0.0.1", url.port or 1883, args.topic)
    # FastStream's own run: its signal handlers end it on SIGTERM or SIGINT.
    asyncio.run(application.run(log_level=logging.INFO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
