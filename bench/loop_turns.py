"""Turns of the event loop and tasks a sequential call costs `toolbus serve`.

Run: `.venv/bin/python bench/loop_turns.py [--calls N] [--ids] [--worker-tree DIR]`. A
private mosquitto and a `toolbus serve` of its own, with a counter put in front of the
event loop's `_run_once` and `create_task` (bench/loop_counter/sitecustomize.py, on the
worker's PYTHONPATH, on only with `TOOLBUS_BENCH_COUNT_TURNS`); one caller (paho,
TCP_NODELAY) makes `--calls` sequential `echo` calls, and the counts read before and
after them (the worker writes them on SIGUSR1) give turns and tasks per call, with the
calls' p50. Each turn is a `select` and a pass over the ready callbacks: on a quiet
machine the latency of a call is mostly its turns. The tasks and callbacks a call
scheduled are listed by name. `--worker-tree DIR` counts DIR's worker.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))

from toolbus.cli.bench.mosquitto import private_broker

HERE = Path(__file__).resolve().parent

ANSWER_BOUND_S = 5.0
START_BOUND_S = 60.0
COUNTS_BOUND_S = 10.0


def counts(worker: subprocess.Popen[bytes], path: Path) -> tuple[int, int, dict[str, int]]:
    """The worker's counts now: turns, tasks, and what was scheduled by name."""
    path.unlink(missing_ok=True)
    worker.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + COUNTS_BOUND_S
    while not path.exists() or not path.read_text().endswith("\n"):
        if time.monotonic() > deadline:
            sys.exit("the worker wrote no counts")
        time.sleep(0.01)
    turns, tasks, named = path.read_text().split("\t")
    return int(turns), int(tasks), ast.literal_eval(named)


def caller(host: str, port: int, ids: bool) -> Callable[[], float]:
    """A paho caller: each call of the result sends one `echo` and waits its reply."""
    answered = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda *_: answered.set()
    client.connect(host, port)
    sock = client.socket()
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.loop_start()
    client.subscribe("lt/reply/caller", qos=1)
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic, props.CorrelationData = "lt/reply/caller", b"1"

    def call() -> float:
        answered.clear()
        body: dict[str, object] = {"arguments": {"text": "x"}}
        if ids:
            body["id"] = uuid.uuid4().hex
        started = time.perf_counter()
        client.publish("lt/call/echo", json.dumps(body), qos=1, properties=props)
        if not answered.wait(ANSWER_BOUND_S):
            return -1.0
        return time.perf_counter() - started

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--ids", action="store_true", help="each call with an id of its own")
    parser.add_argument("--worker-tree", type=Path)
    args = parser.parse_args()
    tree = (args.worker_tree or HERE.parent).resolve() / "worker"
    with private_broker() as broker, tempfile.TemporaryDirectory() as scratch:
        host, port = broker.url.removeprefix("mqtt://").rsplit(":", 1)
        config = Path(scratch) / "toolbus.json"
        config.write_text(json.dumps({"broker_url": broker.url, "topic_prefix": "lt"}))
        out = Path(scratch) / "counts"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "OTEL_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "loop_counter"), str(tree)])
        env["TOOLBUS_BENCH_COUNT_TURNS"] = str(out)
        command = [sys.executable, "-m", "toolbus", "serve", "--config", str(config)]
        worker = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        try:
            call = caller(host, int(port), args.ids)
            deadline = time.monotonic() + START_BOUND_S
            while call() < 0:  # not subscribed yet (QoS 1: the broker keeps nothing for it)
                if time.monotonic() > deadline or worker.poll() is not None:
                    sys.exit("the worker did not answer")
            for _ in range(50):  # warm
                call()
            turns, tasks, named = counts(worker, out)
            took = sorted(call() for _ in range(args.calls))
            turns2, tasks2, named2 = counts(worker, out)
        finally:
            worker.terminate()
            worker.wait(30)
    if took[0] < 0:
        sys.exit("a call was not answered")
    n = args.calls
    print(f"{tree}: {n} sequential echo calls{' with ids' if args.ids else ''}")
    print(f"per call: {(turns2 - turns) / n:.2f} loop turns, {(tasks2 - tasks) / n:.2f} tasks;")
    print(f"p50 {took[n // 2] * 1000:.2f} ms, p99 {took[int(n * 0.99)] * 1000:.2f} ms")
    scheduled = {k: (v - named.get(k, 0)) / n for k, v in named2.items()}
    for name, per_call in sorted(scheduled.items(), key=lambda kv: -kv[1]):
        if per_call >= 0.1:
            print(f"  {per_call:5.2f} a call: {name}")


if __name__ == "__main__":
    main()
