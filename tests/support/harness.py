"""The test harness: a real broker, settings, workers, and an in-process publisher.

Import from here (`from tests.harness import ...`); `conftest.py` only turns these into
fixtures. What each kind of test uses is in `tests/README.md`.
"""

from __future__ import annotations

import asyncio
import getpass
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from tests.support.certs import ListenerTls
from tests.support.processes import BUNDLED_CONFIG
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.backends.local.functions import LocalTool
from toolbus.config import Settings, read_config_file
from toolbus.wire.messages import Outbound, Unconfirmed
from toolbus.worker.wiring import build_worker

if TYPE_CHECKING:  # annotations only: the in-process tests never import the mcp SDK
    from toolbus.worker.service import Worker

START_TIMEOUT_S = 15.0
DEMO_SERVER = {"command": sys.executable, "args": ["-m", "toolbus", "demo-server"]}
# The demo server's static map, as the bundled config writes it (the one place it is written).
DEMO_ARGUMENT_MAPS = read_config_file(BUNDLED_CONFIG)["argument_maps"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if found is None:
        pytest.fail(
            "mosquitto is not installed: run `make test` (it installs it) or apt-get install mosquitto"
        )
    return found


class Broker:
    """A mosquitto process of our own; tests may stop and restart it."""

    def __init__(
        self,
        directory: Path,
        *,
        persistence: bool = False,
        max_queued_messages: int = 1000,
        tls: ListenerTls | None = None,
        passwords: dict[str, str] | None = None,
        acl_file: Path | None = None,
        sys_interval_s: int | None = None,
    ) -> None:
        """`persistence`: sessions and queued messages saved to `directory` every second
        (and restored on start); `max_queued_messages`: per-session backlog (mosquitto's
        default 1000; beyond it the broker drops QoS 1 messages for that session);
        `tls`: the listener speaks TLS only (`url` is then `mqtts://`); `passwords`:
        only these users, with these passwords, may connect; `acl_file`: what each
        of them may do; `sys_interval_s`: how often the broker publishes its `$SYS` counts
        (mosquitto's default: every 10 s), e.g. `$SYS/broker/publish/messages/dropped`."""
        self.port = free_port()
        self.url = f"{'mqtts' if tls else 'mqtt'}://127.0.0.1:{self.port}"
        self.config = directory / "mosquitto.conf"
        saving = (
            f"persistence true\npersistence_location {directory}/\nautosave_interval 1\n"
            if persistence
            else "persistence false\n"
        )
        counts = f"sys_interval {sys_interval_s}\n" if sys_interval_s is not None else ""
        access = "allow_anonymous true\n"
        if passwords is not None:
            access = (
                f"allow_anonymous false\npassword_file {_password_file(directory, passwords)}\n"
            )
        if acl_file is not None:
            access += f"acl_file {acl_file}\n"
        if tls is not None or passwords is not None:
            # Started as root, mosquitto reads these files as the `mosquitto` user, who
            # cannot enter a pytest temporary directory: it stays who started it.
            access += f"user {getpass.getuser()}\n"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"{tls.config() if tls else ''}"
            f"{access}"
            "set_tcp_nodelay true\n"
            f"{saving}"
            f"max_queued_messages {max_queued_messages}\n"
            f"{counts}"
            "log_dest stderr\n"
            "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
        )
        self.log = directory / "mosquitto.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [mosquitto_binary(), "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            bufsize=0,  # unbuffered: select() must see every line that has not been read
        )
        self._wait_running()

    def _wait_running(self) -> None:
        """Block until mosquitto logs that it runs; bounded, and fails with its log."""
        assert self.process is not None and self.process.stderr is not None
        stderr = self.process.stderr
        seen: list[str] = []
        ready = False
        end = time.monotonic() + START_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(stderr, selectors.EVENT_READ)
            while (left := end - time.monotonic()) > 0:
                if not sel.select(left):
                    break
                line = stderr.readline().decode(errors="replace")
                if not line:
                    pytest.fail(f"mosquitto exited: {''.join(seen)}")
                seen.append(line)
                if " running" in line:
                    ready = True
                    break
        if not ready:
            pytest.fail(f"mosquitto did not start within {START_TIMEOUT_S} s: {''.join(seen)}")
        # Keep draining its log so a full pipe never blocks the broker.
        threading.Thread(
            target=self._drain, args=(stderr,), daemon=True, name="mosquitto-log"
        ).start()

    def _drain(self, stream: Any) -> None:
        with stream, self.log.open("ab") as log:
            for line in iter(stream.readline, b""):
                log.write(line)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, nothing saved beyond the last autosave."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _password_file(directory: Path, passwords: dict[str, str]) -> Path:
    """A mosquitto password file (hashed by `mosquitto_passwd`, which ships with it)."""
    path = directory / "passwords"
    path.write_text("")
    tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    for user, password in passwords.items():
        subprocess.run([tool, "-b", str(path), user, password], check=True, timeout=10)
    return path


class RedisServer:
    """A redis-server of our own on a free loopback port, nothing saved to disk; `options`
    more of its command line (`"--maxmemory", "8mb"`)."""

    def __init__(self, *options: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.options = options

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *self.options,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            bufsize=0,
        )
        assert self.process.stdout is not None
        seen = b""
        end = time.monotonic() + START_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            while b"Ready to accept connections" not in seen:
                left = end - time.monotonic()
                if left <= 0 or not sel.select(left):
                    pytest.fail(f"redis-server did not start: {seen.decode(errors='replace')}")
                line = self.process.stdout.readline()
                if not line:
                    pytest.fail(f"redis-server exited: {seen.decode(errors='replace')}")
                seen += line
        # Its later log lines are not read; keep the pipe from filling.
        threading.Thread(
            target=_read_to_end, args=(self.process.stdout,), daemon=True, name="redis-log"
        ).start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def _read_to_end(stream: Any) -> None:
    with stream:
        stream.read()


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def make_settings(broker: Broker, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "broker_url": broker.url,
        "topic_prefix": unique_prefix(),
        "shutdown_grace_s": 5.0,
        "argument_maps": DEMO_ARGUMENT_MAPS,
        # Real attempts and real failures, without the production pauses between them.
        "mcp": {"startup_base_delay_s": 0.05, "recovery_max_delay_s": 0.5},
    }
    values.update(overrides)
    return Settings.model_validate(values)


@asynccontextmanager
async def running_worker(
    settings: Settings,
    tools: Iterable[LocalTool] = (),
    *,
    wait_mcp: bool = True,
    **wiring: Any,
) -> AsyncIterator[Worker]:
    """A worker with the built-in tools and `tools`, subscribed (and its MCP servers
    settled, unless `wait_mcp=False`); drained on exit. `wiring` goes to `build_worker`."""
    async with build_worker(settings, [*BUILTIN_TOOLS, *tools], **wiring) as worker:
        if wait_mcp:
            async with asyncio.timeout(START_TIMEOUT_S * 2):
                await worker.mcp.wait_settled()
        yield worker


MEASUREMENTS: list[str] = []


def measured(line: str) -> None:
    """Figures printed after the run (timings are reported, never asserted)."""
    MEASUREMENTS.append(line)


class ListPublisher:
    """A `Publisher` that keeps what it is given: the pipeline's broker for in-process tests."""

    def __init__(self) -> None:
        self.sent: list[Outbound] = []

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        self.sent.append(out)
        return None  # taken at once (a subclass may give a message up)

    def on(self, topic: str) -> list[Outbound]:
        return [out for out in self.sent if out.topic == topic]


class SpanEnds(SpanProcessor):
    """A span processor that wakes tests waiting for spans to finish.

    A worker ends a message's `process` span just after its reply has left: a test that
    reads the spans the moment the reply arrives can be a step ahead of it. `until`
    waits, bounded, for a condition on the finished spans, woken by each span's end.
    """

    def __init__(self) -> None:
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def on_end(self, span: ReadableSpan) -> None:
        for loop, event in list(self._waiters):
            loop.call_soon_threadsafe(event.set)

    async def until(self, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while not done():
                waiter = (loop, asyncio.Event())
                self._waiters.add(waiter)
                try:
                    if not done():  # a span may have ended before the waiter was added
                        await waiter[1].wait()
                finally:
                    self._waiters.discard(waiter)


SPAN_ENDS = SpanEnds()


def metric_points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """Every data point the reader has of the instrument `name` (a counter's
    `NumberDataPoint`s, a histogram's `HistogramDataPoint`s), across resources and scopes."""
    data = reader.get_metrics_data()
    return [
        point
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]
