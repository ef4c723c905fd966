"""The load generator: a closed loop of QoS 1 requests with N in flight, in its own process.

    python -m toolbus.bench.loadgen --broker mqtt://127.0.0.1:1883 --topic bench/call/echo \
        --payload '{"arguments": {"text": "x"}}' --reply-topic bench/reply/lg --in-flight 64

Lean on purpose, so that it is never what limits a run: paho-mqtt 2.x (MQTT v5,
TCP_NODELAY) in one thread under `loop_forever`, no asyncio; one payload encoded once;
each request carries the reply topic and a correlation number, and each reply sends
the next request from the `on_message` callback. It prints `started` once its first
requests are out, warms up for `--warmup-s`, then prints `window open`, measures for
`--duration-s`, prints `window closed` (a bench reads the responder's CPU at those two
lines), stops sending and waits a bounded time for the requests still in flight. Last
it prints one JSON line (`LoadFigures`).

`--window-on-stdin` opens the window when a line arrives on stdin and closes it at the
next, instead of by the clock: `toolbus bench --loadgens K` runs K of these at once and
opens and closes all their windows together. `--samples` adds each latency in the
window (`latencies_ms`) to the JSON line, so that the bench can merge the K runs'
percentiles (`merged`) rather than average them.

`--ids` gives each request an `id` of its own (unique across processes and runs), as
`toolbus.Client` does: the worker then claims and records every call in its dedup store,
which a request without one skips.

A reply counts as a failure when it is not a JSON object with `ok: true` (`--no-check`
accepts any reply); a request never answered counts too. Failures are counted over
the whole run, warm-up and drain included; latencies and throughput only inside the
window. Its only imports are the standard library and paho, so it starts fast and
the figures code is shared with the raw-SDK baseline (`raw_mcp`).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WINDOW_OPEN = "window open"
WINDOW_CLOSED = "window closed"
STARTED = "started"  # connected, subscribed, the first requests out
DRAIN_BOUND_S = 10.0  # the longest a run waits for its last replies
CONNECT_BOUND_S = 10.0  # from start to the reply subscription, at most


@dataclass(frozen=True, slots=True)
class LoadFigures:
    """What one closed-loop run measured, inside its window (failures: the whole run)."""

    requests: int
    elapsed_s: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    failures: int

    def line(self) -> str:
        return json.dumps(asdict(self))


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest rank over sorted values (0 when there are none): the value that
    `fraction` of the sample is at or below."""
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * fraction // 1))  # ceil without float surprises at 1.0
    return ordered[min(len(ordered), int(rank)) - 1]


def figures(latencies_s: list[float], elapsed_s: float, failures: int) -> LoadFigures:
    ordered = sorted(latencies_s)
    return LoadFigures(
        requests=len(ordered),
        elapsed_s=round(elapsed_s, 6),
        throughput_rps=round(len(ordered) / elapsed_s, 3) if elapsed_s > 0 else 0.0,
        p50_ms=round(percentile(ordered, 0.50) * 1000, 4),
        p99_ms=round(percentile(ordered, 0.99) * 1000, 4),
        max_ms=round((ordered[-1] if ordered else 0.0) * 1000, 4),
        failures=failures,
    )


def merged(parts: list[tuple[LoadFigures, list[float]]]) -> LoadFigures:
    """The figures of several load generators run over the same window, each with its
    latencies in ms (`--samples`): counts and rates summed, percentiles of all the
    latencies together (a mean of percentiles is no percentile), the longest window."""
    if any(len(samples) != part.requests for part, samples in parts):
        raise ValueError("a load generator's samples do not match its request count")
    ordered = sorted(ms for _, samples in parts for ms in samples)
    return LoadFigures(
        requests=len(ordered),
        elapsed_s=max((part.elapsed_s for part, _ in parts), default=0.0),
        throughput_rps=round(sum(part.throughput_rps for part, _ in parts), 3),
        p50_ms=round(percentile(ordered, 0.50), 4),
        p99_ms=round(percentile(ordered, 0.99), 4),
        max_ms=ordered[-1] if ordered else 0.0,
        failures=sum(part.failures for part, _ in parts),
    )


def result_line(result: LoadFigures, latencies_s: list[float] | None) -> str:
    """The JSON line a run ends with; with `latencies_s`, each in ms as the figures
    round them (so merging one run's samples gives back its own figures)."""
    if latencies_s is None:
        return result.line()
    samples = [round(s * 1000, 4) for s in latencies_s]
    return json.dumps({**asdict(result), "latencies_ms": samples})


def wait_for_line() -> None:
    """Blocks until a line (or the end) arrives on stdin: a bench's go."""
    sys.stdin.readline()


def say(line: str) -> None:
    """One line to stdout, flushed at once: the bench acts on it as it arrives."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ClosedLoop:
    """N requests in flight; each reply sends the next until the window closes."""

    def __init__(
        self,
        *,
        topic: str,
        payload: bytes,
        reply_topic: str,
        in_flight: int,
        warmup_s: float,
        duration_s: float,
        check_ok: bool,
        window_on_stdin: bool = False,
        ids: bool = False,
    ) -> None:
        self.topic, self.payload, self.reply_topic = topic, payload, reply_topic
        # With ids: the body's bytes after its `{`, each request's id put before them.
        self.id_prefix = f'{{"id":"lg-{uuid.uuid4().hex[:12]}-'.encode() if ids else b""
        rest = payload.strip()[1:]
        self.after_id = b'"' + rest if rest.strip() == b"}" else b'",' + rest
        self.in_flight, self.warmup_s, self.duration_s = in_flight, warmup_s, duration_s
        self.check_ok, self.window_on_stdin = check_ok, window_on_stdin
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5, client_id="")
        self.client.max_inflight_messages_set(0)  # paho's default of 20 would cap N
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        # One Properties object: paho packs it into bytes inside `publish`, so only the
        # correlation number changes from one request to the next.
        self.props = Properties(PacketTypes.PUBLISH)
        self.props.ResponseTopic = reply_topic
        self.sent_at: dict[bytes, float] = {}
        self.sequence = 0
        self.measuring = False
        self.sending = True
        self.latencies_s: list[float] = []
        self.failures = 0
        self.window: tuple[float, float] = (0.0, 0.0)
        self.counted = 0
        self.started = threading.Event()

    # -- callbacks, all in the loop's thread --------------------------------------

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            say(json.dumps({"error": f"connect refused: {reason}"}))
            client.disconnect()
            return
        sock = client.socket()
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.subscribe(self.reply_topic, qos=1)

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, _mid: int, _r: Any, _p: Any) -> None:
        self.started.set()
        threading.Thread(target=self._clock, name="window", daemon=True).start()
        for _ in range(self.in_flight):
            self._send()
        say(STARTED)

    def _on_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        now = time.perf_counter()
        sent = self.sent_at.pop(getattr(message.properties, "CorrelationData", b""), None)
        if sent is None:
            return  # not ours (a late reply of another run): neither counted nor answered
        if self.check_ok and not _ok(message.payload):
            self.failures += 1
        elif self.measuring:
            self.latencies_s.append(now - sent)
        if self.sending:
            self._send()
        elif not self.sent_at:
            self.client.disconnect()

    def _send(self) -> None:
        self.sequence += 1
        # Decimal digits, not the number's bytes: FastStream carries Correlation Data as
        # text (decoded with errors="replace"), so a byte over 0x7f would not come back.
        correlation = b"%d" % self.sequence
        self.props.CorrelationData = correlation
        self.sent_at[correlation] = time.perf_counter()
        self.client.publish(self.topic, self.body(self.sequence), qos=1, properties=self.props)

    def body(self, sequence: int) -> bytes:
        """The request numbered `sequence`: the one payload, or with its own id (`--ids`)."""
        if not self.id_prefix:
            return self.payload
        return b"%s%d%s" % (self.id_prefix, sequence, self.after_id)

    # -- the window, on a thread of its own -----------------------------------------

    def _clock(self) -> None:
        wait_for_line() if self.window_on_stdin else time.sleep(self.warmup_s)
        opened = time.perf_counter()
        self.measuring = True
        say(WINDOW_OPEN)
        wait_for_line() if self.window_on_stdin else time.sleep(self.duration_s)
        self.measuring = False
        closed = time.perf_counter()
        self.counted = len(self.latencies_s)  # a reply appended after this is not counted
        self.window = (opened, closed)
        say(WINDOW_CLOSED)  # before the last replies can end the run and print its figures
        self.sending = False
        time.sleep(DRAIN_BOUND_S)
        self.client.disconnect()  # replies still missing after the bound are failures

    def run(self, host: str, port: int) -> LoadFigures:
        self.client.connect(host, port, keepalive=60)
        guard = threading.Timer(CONNECT_BOUND_S, self._no_start)
        guard.daemon = True
        guard.start()
        self.client.loop_forever()
        guard.cancel()
        opened, closed = self.window
        unanswered = len(self.sent_at)
        return figures(self.measured, closed - opened, self.failures + unanswered)

    @property
    def measured(self) -> list[float]:
        """The latencies inside the window, in seconds."""
        return self.latencies_s[: self.counted]

    def _no_start(self) -> None:
        if not self.started.is_set():
            self.client.disconnect()


def _ok(payload: bytes | bytearray) -> bool:
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("ok") is True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True, help="mqtt://host:port")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--payload", required=True, help="the request's JSON body")
    parser.add_argument("--reply-topic", required=True)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--no-check", action="store_true", help="accept replies without ok")
    parser.add_argument(
        "--window-on-stdin", action="store_true", help="open, then close, at a line on stdin"
    )
    parser.add_argument("--samples", action="store_true", help="add latencies_ms to the JSON")
    parser.add_argument("--ids", action="store_true", help="an id of its own in each request")
    args = parser.parse_args(argv)
    if args.ids and not args.payload.lstrip().startswith("{"):
        parser.error("--ids needs a JSON object as the payload")
    url = urlsplit(args.broker)
    loop = ClosedLoop(
        topic=args.topic,
        payload=json.dumps(json.loads(args.payload)).encode(),
        reply_topic=args.reply_topic,
        in_flight=args.in_flight,
        warmup_s=args.warmup_s,
        duration_s=args.duration_s,
        check_ok=not args.no_check,
        window_on_stdin=args.window_on_stdin,
        ids=args.ids,
    )
    result = loop.run(url.hostname or "127.0.0.1", url.port or 1883)
    say(result_line(result, loop.measured if args.samples else None))
    return 0 if loop.started.is_set() else 1


if __name__ == "__main__":
    sys.exit(main())
