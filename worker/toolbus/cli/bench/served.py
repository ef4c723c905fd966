"""The worker under test: `toolbus serve` as its own process, from a private config.

The bench writes `toolbus.json` in its scratch directory (broker, `topic_prefix`,
`log_level`, the demo MCP server under `mcpServers`) and starts `python -m toolbus
serve --config ...` with `--processes N` when N is not 1. Its environment is the
bench's without `TOOLBUS_*` and `OTEL_*` (the private config is the whole truth), plus
the OTLP variables when tracing is on. Its stderr (its log) goes to a file in the
scratch directory, as a service's log would go to a file or journal; the tail is
shown when it fails to start.

`worker_tree` runs the worker of another checkout for a before/after pair, as
bench/flood.py does: a directory holding a `toolbus` link to `DIR/worker`, first on
PYTHONPATH of the worker and of its demo server.

Ready means: as many workers as processes have published `online` on
`{prefix}/status/workers/{id}` with every MCP server `ready` (from their own status or
`{prefix}/status/servers/{name}/{id}`), and then a call of every probed tool answered `ok`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbus.transport import MqttConnection
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Inbound, Outbound

READY_BOUND_S = 60.0
STOP_BOUND_S = 30.0
PROBE_PAUSE_S = 0.1  # between probes of a worker that is not answering `ok` yet
PROBE_ATTEMPTS = 100
SERVER = "devices"
LOG_TAIL_CHARS = 3000


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How the worker under test runs."""

    log_level: str = "WARNING"
    processes: int = 1
    worker_tree: Path | None = None
    otlp_endpoint: str | None = None  # tracing on, exporting here
    settings: tuple[tuple[str, object], ...] = ()  # more of the config (`--worker-setting`)
    python_path: tuple[str, ...] = ()  # more folders first on PYTHONPATH (a plugin's)
    env: tuple[tuple[str, str], ...] = ()  # more of the environment (the guards' OTEL_*)
    servers: tuple[tuple[str, dict[str, Any]], ...] = ()  # MCP servers beside the demo one
    tracing_env: tuple[tuple[str, str], ...] = ()  # more OTEL_* with tracing (`--tracing-env`)


@dataclass(frozen=True, slots=True)
class Probe:
    topic: str
    payload: bytes


def environment(directory: Path, options: ServeOptions) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLBUS_", "OTEL_"))}
    tree = () if options.worker_tree is None else (str(tree_path(directory, options.worker_tree)),)
    if tree or options.python_path:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (*tree, *options.python_path, env.get("PYTHONPATH")) if p
        )
    if options.otlp_endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = options.otlp_endpoint
        env["OTEL_TRACES_EXPORTER"] = "otlp"
        env["OTEL_METRICS_EXPORTER"] = "none"  # tracing's cost alone
        env.update(options.tracing_env)  # a sampler, the batch processor's settings
    env.update(options.env)
    return env


def tree_path(directory: Path, worker_tree: Path) -> Path:
    """A directory whose `toolbus` is `worker_tree`'s package, made once."""
    tree = directory / "tree"
    if not tree.exists():
        tree.mkdir()
        (tree / "toolbus").symlink_to(_package_of(worker_tree.resolve()))
    return tree


def write_config(directory: Path, broker_url: str, prefix: str, options: ServeOptions) -> Path:
    server: dict[str, Any] = {"command": sys.executable, "args": ["-m", "toolbus", "demo-server"]}
    if options.worker_tree is not None:
        server["env"] = {"PYTHONPATH": str(tree_path(directory, options.worker_tree))}
    config = directory / f"{prefix}.json"
    config.write_text(
        json.dumps(
            {
                "broker_url": broker_url,
                "topic_prefix": prefix,
                "log_level": options.log_level,
                "mcpServers": {SERVER: server, **dict(options.servers)},
                **dict(options.settings),
            }
        )
    )
    return config


@contextmanager
def served_worker(
    directory: Path, broker_url: str, prefix: str, options: ServeOptions, probes: list[Probe]
) -> Iterator[subprocess.Popen[bytes]]:
    """A ready `toolbus serve` until the block ends; then SIGTERM, drained within a bound."""
    config = write_config(directory, broker_url, prefix, options)
    command = [sys.executable, "-m", "toolbus", "serve", "--config", str(config)]
    if options.processes != 1:
        command += ["--processes", str(options.processes)]
    log = log_path(directory, prefix)
    with log.open("wb") as stderr:
        proc = subprocess.Popen(  # noqa: S603 -- our own interpreter and arguments
            command,
            env=environment(directory, options),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        try:
            asyncio.run(wait_ready(broker_url, prefix, options.processes, probes, proc))
        except (TimeoutError, RuntimeError) as exc:
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise RuntimeError(
                f"toolbus serve did not get ready ({exc!r}); its log:\n{tail}"
            ) from exc
        yield proc
    finally:
        stop(proc)


def log_path(directory: Path, prefix: str) -> Path:
    """Where the worker serving `prefix` writes its log (its stderr)."""
    return directory / f"{prefix}.log"


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_BOUND_S)


class _Statuses:
    """What the workers under one prefix say about themselves."""

    def __init__(self, prefix: str) -> None:
        self.workers = f"{prefix}/status/workers/"
        self.servers = f"{prefix}/status/servers/"
        self.online: set[str] = set()
        self.states: dict[str, dict[str, str]] = {}  # worker id -> server -> state

    def take(self, message: Inbound) -> None:
        try:
            body = json.loads(message.payload)
        except ValueError:
            return  # a status cleared (empty payload)
        if not isinstance(body, dict):
            return
        worker = str(body.get("worker_id"))
        if message.topic.startswith(self.workers):
            if body.get("state") == "online":
                self.online.add(worker)
            else:
                self.online.discard(worker)
            servers = body.get("servers") or {}  # name -> {"state", "last_error"}
            self.states.setdefault(worker, {}).update(
                {name: str(server.get("state")) for name, server in servers.items()}
            )
        elif message.topic.startswith(self.servers):
            self.states.setdefault(worker, {})[str(body.get("server"))] = str(body.get("state"))

    def ready(self) -> int:
        return sum(1 for w in self.online if self.states.get(w, {}).get(SERVER) == "ready")


async def wait_ready(
    broker_url: str, prefix: str, processes: int, probes: list[Probe], proc: subprocess.Popen[bytes]
) -> None:
    """Ready within the bound, or RuntimeError as soon as the process exits."""
    ready = asyncio.create_task(_ready(broker_url, prefix, processes, probes), name="ready")
    exited = asyncio.create_task(_exited(proc), name="exited")
    async with asyncio.timeout(READY_BOUND_S):
        done, _ = await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
    for task in (ready, exited):
        task.cancel()
    if ready not in done:
        raise RuntimeError(f"it exited with {proc.returncode}")
    await ready


async def _exited(proc: subprocess.Popen[bytes]) -> None:
    """Returns when the process exits: its pidfd becomes readable (Linux 5.3)."""
    exited = asyncio.Event()
    fd = os.pidfd_open(proc.pid)
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, exited.set)
    try:
        await exited.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _ready(broker_url: str, prefix: str, processes: int, probes: list[Probe]) -> None:
    reply_topic = f"{prefix}/reply/bench-probe-{uuid.uuid4().hex[:8]}"
    statuses = _Statuses(prefix)
    async with MqttConnection(BrokerUrl.from_url(broker_url)) as conn:
        await conn.subscribe([f"{prefix}/status/#", reply_topic])
        messages = conn.messages()
        while statuses.ready() < processes:
            statuses.take(await anext(messages))
        for probe in probes:
            for _ in range(PROBE_ATTEMPTS):
                if await _answered_ok(conn, messages, probe, reply_topic):
                    break
                await asyncio.sleep(PROBE_PAUSE_S)  # not yet: ask again in a moment
            else:
                raise RuntimeError(f"no `ok` from {probe.topic}")


async def _answered_ok(
    conn: MqttConnection, messages: AsyncIterator[Inbound], probe: Probe, reply_topic: str
) -> bool:
    correlation = uuid.uuid4().bytes
    await conn.publish(
        Outbound(
            topic=probe.topic,
            payload=probe.payload,
            response_topic=reply_topic,
            correlation_data=correlation,
        )
    )
    reply = await anext(messages)
    while reply.correlation_data != correlation:
        reply = await anext(messages)
    body = json.loads(reply.payload)
    return isinstance(body, dict) and body.get("ok") is True


def _package_of(tree: Path) -> Path:
    """A checkout's `toolbus` package: worker/toolbus/ (src layout), or worker/ itself in
    checkouts from before it (as bench/paired.py's `package_of`, which cannot import this)."""
    nested = tree / "worker" / "toolbus"
    return nested if (nested / "__init__.py").is_file() else tree / "worker"
