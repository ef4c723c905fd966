"""Worker processes for the delivery and chaos tests: `toolbus serve`, started, SIGKILLed
and restarted, with a local tool that records every execution in a file.

Each worker is its own process (so a kill is a real kill, and its memory is its own);
readiness is the worker's own "subscribed" log line, read within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from tests.cli.test_cli import cli_env
from tests.support.compose_stack import mosquitto_conf
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from tests.support.processes import ROOT, install_plugin

READY_TIMEOUT_S = 30.0

RECORDING_TOOL = textwrap.dedent(
    """
    import asyncio, logging, os

    from toolbus import tool

    @tool
    async def record(key: str, hold_s: float = 0.0) -> str:
        "Appends `key` and this process's id to $TB_RECORD_FILE (a line per run), then holds."
        with open(os.environ["TB_RECORD_FILE"], "a") as f:
            f.write(f"{key} {os.getpid()}\\n")
        logging.getLogger("tb_record").warning("record started %s", key)
        await asyncio.sleep(hold_s)  # simulated work
        return key

    @tool
    async def report(key: str, size: int) -> str:
        "Records its run as `record` does, and answers `size` characters."
        with open(os.environ["TB_RECORD_FILE"], "a") as f:
            f.write(f"{key} {os.getpid()}\\n")
        return "r" * size
    """
)


def recording_env(tmp_path: Path, prefix: str, **settings: str) -> dict[str, str]:
    """The environment of a worker with the recording tool; `settings` as TOOLBUS_* values."""
    plugin = install_plugin(
        tmp_path / "plugin",
        "tb_record",
        RECORDING_TOOL,
        {"record": "tb_record:record", "report": "tb_record:report"},
    )
    env = cli_env(prefix, plugin)
    env["TB_RECORD_FILE"] = str(tmp_path / "executions")
    env.update({f"TOOLBUS_{key.upper()}": value for key, value in settings.items()})
    if "worker_id" in settings:  # a restart resumes its session only under keyed client ids
        env.setdefault("TOOLBUS_CLIENT_ID_SECRET", f"secret-of-{prefix}")
    return env


class Executions:
    """What the recording tool wrote: one (key, pid) per execution."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[tuple[str, int]]:
        if not self.path.exists():
            return []
        return [
            (key, int(pid))
            for key, pid in (line.split() for line in self.path.read_text().splitlines())
        ]

    def counts(self) -> Counter[str]:
        return Counter(key for key, _ in self.lines())

    def by(self, pid: int) -> set[str]:
        return {key for key, run_pid in self.lines() if run_pid == pid}


class WorkerProcess:
    """One `toolbus serve` (no config file: the environment says everything)."""

    def __init__(self, broker_url: str, env: dict[str, str]) -> None:
        self.broker_url, self.env = broker_url, env
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.log: list[str] = []
        self.started: set[str] = set()  # the recording tool's keys, from its log lines
        self.said: Counter[str] = Counter()  # every line's event, its digits dropped
        self.new_line = asyncio.Event()  # set at each line; workers may share one

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        """Started and subscribed (its own log line says so)."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolbus",
            "serve",
            "--broker",
            self.broker_url,
            env=self.env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        subscribed = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(subscribed), name=f"worker-{self.pid}")
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await subscribed
        except TimeoutError:
            raise AssertionError(f"worker not subscribed: {self.log[-20:]}") from None

    async def _read(self, subscribed: asyncio.Future[None]) -> None:
        """Every line is read (a full pipe would stall the worker); the last ones are kept."""
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace")
            with contextlib.suppress(ValueError):  # not JSON: keep the raw line
                text = str(json.loads(text).get("event", text))
            self.log = [*self.log[-50:], text]
            self.said[re.sub(r"\S*\d\S*", "#", text.split(":", 1)[0]).strip()] += 1
            if text.startswith("record started "):
                self.started.add(text.removeprefix("record started ").strip())
            self.new_line.set()
            if "subscribed to" in text and not subscribed.done():
                subscribed.set_result(None)
        if not subscribed.done():
            subscribed.set_exception(AssertionError(f"worker exited: {self.log[-20:]}"))

    async def kill(self) -> None:
        """SIGKILL: no drain, no status, no acknowledgements."""
        await self._end(signal.SIGKILL)

    async def stop(self) -> None:
        await self._end(signal.SIGTERM)

    async def _end(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            async with asyncio.timeout(30):
                await self.proc.wait()
        except TimeoutError:  # a stop that hangs: what it last said, then a real kill
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"worker did not exit on {sig.name}: {self.log[-20:]}") from None
        finally:
            if self._reader is not None:
                async with asyncio.timeout(10):
                    await self._reader  # the pipe ends with the process

    def rss_mib(self) -> float:
        """Resident memory now, from /proc (Linux)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


BROKER_DROPPED = "$SYS/broker/publish/messages/dropped"


class BrokerDrops:
    """mosquitto's own count of the messages it dropped at its queue limits
    (`max_queued_messages`), followed on its `$SYS` topic from when this is entered: the
    broker publishes it each `sys_interval` when it changed (start the `Broker` with
    `sys_interval_s=1`), retained, so the count at entry comes first."""

    def __init__(self, broker_url: str) -> None:
        self._watcher = Caller(broker_url)
        self._at_entry = self._latest = 0

    async def __aenter__(self) -> Self:
        await self._watcher.__aenter__()
        await self._watcher.subscribe(BROKER_DROPPED)
        self._at_entry = self._latest = await self._next()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._watcher.__aexit__(None, None, None)

    async def _next(self, timeout_s: float = 10.0) -> int:
        message = await self._watcher.next_message(timeout_s)
        assert isinstance(message.payload, bytes)
        return int(message.payload)

    def so_far(self) -> int:
        """Dropped since entry, as of the last count the broker published."""
        for message in self._watcher.unclaimed():
            assert isinstance(message.payload, bytes)
            self._latest = int(message.payload)
        return self._latest - self._at_entry

    async def beyond(self, count: int, timeout_s: float = 30.0) -> int:
        """Once more than `count` were dropped since entry: how many."""
        async with asyncio.timeout(timeout_s):
            while self.so_far() <= count:
                self._latest = await self._next(timeout_s)
        return self._latest - self._at_entry


SHIPPED_BROKERS = ("make run", "compose")  # config/mosquitto.conf, compose's mosquitto.conf


def shipped_broker(directory: Path, which: str) -> Broker:
    """A `Broker` (not started) running a shipped mosquitto.conf as written, but on a free
    loopback port, saving to `directory` and publishing its `$SYS` counts each second:
    `make run`'s (config/mosquitto.conf) or the compose stack's."""
    broker = Broker(directory)
    if which == "compose":
        text = mosquitto_conf(broker.port, directory)
    else:
        text = "".join(
            f"listener {broker.port} 127.0.0.1\n" if line.split()[:1] == ["listener"] else line
            for line in (ROOT / "config" / "mosquitto.conf").read_text().splitlines(True)
        )
    broker.config.write_text(f"{text}sys_interval 1\n")
    return broker


@dataclass(frozen=True)
class Flood:
    """What a flood did: requests answered, and the worker's RSS along the way (MiB)."""

    requests: int
    answered: int
    answered_when_published: int  # the rest waited in the broker
    idle_mib: float
    published_mib: float
    peak_mib: float
    seconds: float

    def line(self) -> str:
        return (
            f"flood of {self.requests} requests: answered {self.answered} in "
            f"{self.seconds:.0f} s ({self.answered_when_published} of them when all were "
            f"published); worker RSS idle {self.idle_mib:.0f} MiB, "
            f"all published {self.published_mib:.0f} MiB, peak {self.peak_mib:.0f} MiB"
        )


async def flood(
    broker_url: str, prefix: str, worker: WorkerProcess, requests: int, timeout_s: float
) -> Flood:
    """`requests` calls to `echo`, each with its own id, published as fast as the broker
    takes them (from this process: the worker's memory is its own); then every reply."""
    async with Caller(broker_url) as requester:
        reply_topic = f"{prefix}/reply/flood"
        await requester.subscribe(reply_topic)
        idle_mib = worker.rss_mib()
        started = time.monotonic()
        for start in range(0, requests, 1000):
            await asyncio.gather(
                *(
                    requester.publish(
                        f"{prefix}/call/echo",
                        f'{{"id": "f{n}", "arguments": {{"text": "x"}}}}',
                        response_topic=reply_topic,
                    )
                    for n in range(start, min(start + 1000, requests))
                )
            )
        published_mib = worker.rss_mib()
        answered_when_published = requester.messages.qsize()
        answered: set[str] = set()
        samples = [published_mib]
        async with asyncio.timeout(timeout_s):
            while len(answered) < requests:
                message = await requester.next_message()
                answered.add(json.loads(message.payload)["id"])
                if len(answered) % max(requests // 10, 1) == 0:
                    samples.append(worker.rss_mib())
    return Flood(
        requests,
        len(answered),
        answered_when_published,
        idle_mib,
        published_mib,
        max(samples),
        time.monotonic() - started,
    )
