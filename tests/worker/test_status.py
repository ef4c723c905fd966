"""Truthful statuses and `toolbus status`, against real workers and a real mosquitto.

An independent observer (a test `Caller` subscribed to `{prefix}/status/#`) tells when
a status has arrived; what a newcomer sees is read with `pool.snapshot` (or the
`toolbus status --once --json` process itself). Brokers restarted here run without
persistence, so only the worker's republication can bring a status back. Expiry has no
event of its own (the broker drops the message silently): that one test asks again
until the status is gone, within a bound, each ask a bounded snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.cli.test_cli import cli_env, run_cli
from tests.support.harness import (
    DEMO_SERVER,
    Broker,
    free_port,
    make_settings,
    running_worker,
    unique_prefix,
)
from tests.support.mqtt import Caller
from tests.support.processes import start_serve, stop_process
from toolbus.cli.status_view import render
from toolbus.client.pool import Pool, snapshot
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.contracts import ServerStatus, WorkerStatus
from toolbus.wire.messages import Inbound
from toolbus.wire.topics import Topics

BOUND_S = 30.0
SNAPSHOT_TIMEOUT_S = 5.0


class Statuses:
    """Every status under a prefix as it arrives: the latest body and Message Expiry
    per topic, and how many came on each (heartbeats)."""

    def __init__(self, caller: Caller, prefix: str) -> None:
        self.caller, self.prefix = caller, prefix
        self.latest: dict[str, dict[str, Any]] = {}
        self.expiry_s: dict[str, int | None] = {}
        self.count: dict[str, int] = {}
        self.payloads: list[bytes] = []  # every one, in order
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Statuses:
        await self.caller.subscribe(f"{self.prefix}/status/#")
        self._task = asyncio.create_task(self._read(), name="statuses")
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _read(self) -> None:
        while True:
            message = await self.caller.messages.get()
            topic, payload = message.topic.value, message.payload
            assert isinstance(payload, bytes)
            self.payloads.append(payload)
            async with self._changed:
                self.latest[topic] = json.loads(payload) if payload else {}
                self.expiry_s[topic] = getattr(message.properties, "MessageExpiryInterval", None)
                self.count[topic] = self.count.get(topic, 0) + 1
                self._changed.notify_all()

    def worker(self, worker_id: str) -> dict[str, Any]:
        return self.latest.get(f"{self.prefix}/status/workers/{worker_id}", {})

    def server(self, server: str, worker_id: str) -> dict[str, Any]:
        return self.latest.get(f"{self.prefix}/status/servers/{server}/{worker_id}", {})

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(BOUND_S), self._changed:
            await self._changed.wait_for(done)


def online_and_ready(statuses: Statuses, worker_id: str) -> Callable[[], bool]:
    def check() -> bool:
        worker = statuses.worker(worker_id)
        devices = worker.get("servers", {}).get("devices", {})
        return worker.get("state") == "online" and devices.get("state") == "ready"

    return check


def topics_of(prefix: str) -> Topics:
    return Topics(prefix, "toolbus", (f"{prefix}/reply/",))


async def pool_of(url: str, prefix: str) -> Pool:
    return await snapshot(BrokerUrl.from_url(url), topics_of(prefix), timeout_s=SNAPSHOT_TIMEOUT_S)


@contextlib.asynccontextmanager
async def served(
    url: str, prefix: str, **settings: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`toolbus serve` (the bundled config: the demo server `devices`), killed at the end."""
    env = cli_env(prefix)
    env.update({f"TOOLBUS_{k.upper()}": v for k, v in settings.items()})
    proc = await start_serve(url, env, stderr=asyncio.subprocess.DEVNULL)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a frozen one too
        await stop_process(proc)


async def test_status_once_json_then_a_killed_worker_is_offline_by_its_will(
    broker: Broker, caller: Caller
) -> None:
    prefix, worker_id = unique_prefix(), "statuscli-w"
    async with (
        Statuses(caller, prefix) as statuses,
        served(broker.url, prefix, worker_id=worker_id) as proc,
    ):
        await statuses.until(online_and_ready(statuses, worker_id))

        code, out, err = await run_cli(
            "status", "--once", "--json", "--broker", broker.url, env=cli_env(prefix)
        )
        assert code == 0, err
        shown = json.loads(out)
        [worker] = [WorkerStatus.model_validate(w) for w in shown["workers"]]
        assert (worker.worker_id, worker.state, worker.in_flight) == (worker_id, "online", 0)
        assert worker.servers["devices"].state == "ready"
        # The release it runs, from its package metadata (issue 30.10): as the raw status says.
        assert worker.version == statuses.worker(worker_id)["version"] == version("toolbus")
        assert worker.since is not None
        assert datetime.now(UTC) - worker.since < timedelta(seconds=BOUND_S)
        [server] = [ServerStatus.model_validate(s) for s in shown["servers"]]
        assert (server.server, server.worker_id, server.state) == ("devices", worker_id, "ready")
        assert server.tool_count >= 1

        code, out, err = await run_cli(
            "status", "--once", "--broker", broker.url, env=cli_env(prefix)
        )
        assert code == 0, err
        assert worker_id in out and "devices" in out

        proc.kill()  # no drain, no final status: only the broker's will can say it
        await statuses.until(lambda: statuses.worker(worker_id).get("state") == "offline")
        pool = await pool_of(broker.url, prefix)
        [gone] = pool.workers()
        assert gone.state == "offline"
        assert gone.since is None  # the will's: when it went is unknown
        assert gone.servers == {}
        assert gone.version == version("toolbus")  # the will says it too

        # Shown, but no worker is online: a script's check fails (3, as no reply would).
        code, out, err = await run_cli(
            "status", "--once", "--json", "--broker", broker.url, env=cli_env(prefix)
        )
        assert code == 3, err
        assert [w["state"] for w in json.loads(out)["workers"]] == ["offline"]


async def test_status_once_exits_3_when_no_worker_is_there(broker: Broker) -> None:
    env = cli_env(unique_prefix())
    code, out, err = await run_cli("status", "--once", "--broker", broker.url, env=env)
    assert code == 3, err
    assert out  # the (empty) snapshot is shown all the same
    code, out, err = await run_cli("status", "--json", "--broker", broker.url, env=env)
    assert code == 3, err
    assert json.loads(out) == {"workers": [], "servers": []}


async def test_statuses_come_back_after_a_broker_restart(tmp_path: Path) -> None:
    own = Broker(tmp_path)  # no persistence: the restarted broker has no retained message
    own.start()
    try:
        settings = make_settings(
            own,
            worker_id="restart-w",
            reconnect_max_delay_s=1.0,
            mcpServers={"devices": DEMO_SERVER},
        )
        prefix = settings.topic_prefix
        async with running_worker(settings):
            async with Caller(own.url) as caller, Statuses(caller, prefix) as statuses:
                await statuses.until(online_and_ready(statuses, "restart-w"))
                before = statuses.worker("restart-w")["since"]
            own.stop()
            own.start()
            async with Caller(own.url) as caller, Statuses(caller, prefix) as statuses:
                await statuses.until(
                    lambda: (
                        statuses.server("devices", "restart-w").get("state") == "ready"
                        and online_and_ready(statuses, "restart-w")()
                    )
                )
            pool = await pool_of(own.url, prefix)
            [worker] = pool.workers()
            assert worker.state == "online" and worker.servers["devices"].state == "ready"
            assert worker.since is not None and worker.since > datetime.fromisoformat(before)
            assert [(s.server, s.state) for s in pool.servers()] == [("devices", "ready")]
    finally:
        own.stop()


async def test_a_clean_stop_publishes_final_states_that_expire(
    broker: Broker, caller: Caller
) -> None:
    settings = make_settings(
        broker, worker_id="clean-w", status_interval_s=5.0, mcpServers={"devices": DEMO_SERVER}
    )
    prefix = settings.topic_prefix
    async with Statuses(caller, prefix) as statuses:
        async with running_worker(settings):
            await statuses.until(online_and_ready(statuses, "clean-w"))
        await statuses.until(lambda: statuses.worker("clean-w").get("state") == "offline")

        pool = await pool_of(broker.url, prefix)
        [worker] = pool.workers()
        assert worker.state == "offline" and worker.since is not None  # a clean stop's
        assert worker.servers["devices"].state == "stopped"
        [server] = pool.servers()
        assert (server.server, server.state) == ("devices", "stopped")
        # Nothing piles up: the final statuses expire like the heartbeat's (3 intervals).
        for topic in (
            f"{prefix}/status/workers/clean-w",
            f"{prefix}/status/servers/devices/clean-w",
        ):
            # mosquitto forwards what remains: a second boundary may pass in between
            assert statuses.expiry_s[topic] in (14, 15)


async def test_a_snapshot_of_a_busy_pool_does_not_wait_for_a_quiet_gap(
    broker: Broker, caller: Caller
) -> None:
    """Heartbeats arriving every 50 ms (a pool of hundreds) never leave 0.2 s of quiet: the
    snapshot is still taken soon after the barrier, not at its timeout."""
    prefix = f"busy{os.getpid()}"
    body = {"state": "online", "worker_id": "w", "since": "2025-01-01T00:00:00Z"}
    stop = asyncio.Event()

    async def churn() -> None:
        while not stop.is_set():
            await caller.publish(f"{prefix}/status/workers/w", json.dumps(body))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)  # the pace, not a synchronisation

    churning = asyncio.create_task(churn(), name="churn")
    try:
        started = asyncio.get_running_loop().time()
        pool = await snapshot(BrokerUrl.from_url(broker.url), topics_of(prefix), timeout_s=20)
        took_s = asyncio.get_running_loop().time() - started
    finally:
        stop.set()
        await churning
    assert [w.worker_id for w in pool.workers()] == ["w"]
    assert took_s < 10, took_s  # listening on is bounded (1 s); the timeout is 20 s


async def test_a_frozen_worker_s_statuses_expire(broker: Broker, caller: Caller) -> None:
    """A worker that stops heartbeating while its connection stays open (SIGSTOP: no
    will before the keepalive runs out, a minute on) drops out within 3 intervals."""
    prefix, worker_id = unique_prefix(), "frozen-w"
    async with (
        Statuses(caller, prefix) as statuses,
        served(broker.url, prefix, worker_id=worker_id, status_interval_s="0.5") as proc,
    ):
        worker_topic = f"{prefix}/status/workers/{worker_id}"
        await statuses.until(online_and_ready(statuses, worker_id))
        seen = statuses.count[worker_topic]
        await statuses.until(lambda: statuses.count[worker_topic] >= seen + 2)  # heartbeats
        assert statuses.expiry_s[worker_topic] in (1, 2)  # ceil(3 x 0.5 s), less what passed
        assert statuses.expiry_s[f"{prefix}/status/servers/devices/{worker_id}"] in (1, 2)

        os.kill(proc.pid, signal.SIGSTOP)
        async with asyncio.timeout(BOUND_S):
            while (pool := await pool_of(broker.url, prefix)).workers() or pool.servers():
                pass  # each snapshot is its own bounded wait (a quiet period)
        assert statuses.worker(worker_id)["state"] == "online"  # no will was sent


async def test_status_exits_4_when_the_broker_is_unreachable() -> None:
    nobody = f"mqtt://127.0.0.1:{free_port()}"
    code, _, err = await run_cli(
        "status", "--once", "--json", "--broker", nobody, "--timeout", "2", env=cli_env("nobody")
    )
    assert code == 4, err


def inbound(topic: str, body: object, expiry_s: int | None = None, at: float = 0.0) -> Inbound:
    payload = json.dumps(body).encode() if body is not None else b""
    return Inbound(topic=topic, payload=payload, expiry_s=expiry_s, received_at=at)


def test_the_pool_forgets_expired_and_cleared_statuses() -> None:
    now = [100.0]
    pool = Pool(topics_of("p"), clock=lambda: now[0])
    since = "2025-01-01T00:00:00Z"
    worker = {"state": "online", "worker_id": "a", "since": since}
    server = {"server": "s", "state": "ready", "worker_id": "a", "since": since}
    assert pool.take(inbound("p/status/workers/a", worker, expiry_s=10, at=100.0))
    assert pool.take(inbound("p/status/workers/b", {**worker, "worker_id": "b"}))
    assert pool.take(inbound("p/status/servers/s/a", server, expiry_s=10, at=100.0))
    assert not pool.take(inbound("p/status/servers/s", server))  # the old one-per-server topic
    assert not pool.take(inbound("p/status/workers/c", {"state": "sideways"}))
    assert not pool.take(inbound("p/call/x", worker))
    assert [w.worker_id for w in pool.workers()] == ["a", "b"]
    assert pool.to_json()["servers"][0]["server"] == "s"

    now[0] = 110.0  # a's statuses expired
    assert [w.worker_id for w in pool.workers()] == ["b"]
    assert pool.servers() == []
    assert pool.take(inbound("p/status/workers/b", None))  # cleared
    assert pool.to_json() == {"workers": [], "servers": []}


def test_the_view_shows_broker_text_as_written_never_as_markup_or_controls() -> None:
    """Anyone who may publish a status chooses its text: `[/x]` would be rich markup (and
    raise), an escape sequence would reach the operator's terminal."""
    pool = Pool(topics_of("p"), clock=lambda: 100.0)
    since = "2025-01-01T00:00:00Z"
    hostile = "cannot open [/data/models] \x1b[2J[bold]"
    worker = {"state": "online", "worker_id": "w[b]x", "since": since}
    server = {
        "server": "s",
        "state": "down",
        "worker_id": "w[b]x",
        "since": since,
        "last_error": hostile,
    }
    assert pool.take(inbound("p/status/workers/w[b]x", worker))
    assert pool.take(inbound("p/status/servers/s/w[b]x", server))
    console = Console(width=300, file=io.StringIO(), force_terminal=False)
    console.print(render(pool, topics_of("p")))
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "cannot open [/data/models] \\u001b[2J[bold]" in shown
    assert "\x1b" not in shown and "w[b]x" in shown


def test_the_view_shows_each_worker_s_version() -> None:
    """Mid-upgrade, an operator sees which workers still run the old release; a status
    from before versions were reported shows a dash."""
    pool = Pool(topics_of("p"), clock=lambda: 100.0)
    since = "2025-01-01T00:00:00Z"
    new = {"state": "online", "worker_id": "new", "since": since, "version": "9.8.7"}
    old = {"state": "online", "worker_id": "old", "since": since}
    assert pool.take(inbound("p/status/workers/new", new))
    assert pool.take(inbound("p/status/workers/old", old))
    console = Console(width=200, file=io.StringIO(), force_terminal=False)
    console.print(render(pool, topics_of("p")))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert any("new" in line and "9.8.7" in line for line in lines)
    assert any("old" in line and " - " in line for line in lines)


@pytest.mark.parametrize(
    ("topic", "subject"),
    [
        ("p/status/workers/w1", ("worker", "w1", "")),
        ("p/status/servers/devices/w1", ("server", "devices", "w1")),
        ("p/status/servers/a/b/w1", ("server", "a/b", "w1")),
        ("p/status/servers/devices", None),
        ("p/status/workers/w1/x", None),
        ("p/status/workers/", None),
        ("q/status/workers/w1", None),
        ("p/status/.barrier/x", None),
    ],
)
def test_status_topics_read_back(topic: str, subject: tuple[str, str, str] | None) -> None:
    assert topics_of("p").status_of(topic) == subject


async def test_statuses_say_how_many_tools_a_server_lists_never_which(
    broker: Broker, caller: Caller
) -> None:
    """Every caller may read `{prefix}/status/#` (the shipped ACL); a tool its caller
    profile hides must not be named there, so a server's status counts its tools."""
    prefix = unique_prefix()
    settings = make_settings(broker, topic_prefix=prefix, mcpServers={"devices": DEMO_SERVER})
    async with Statuses(caller, prefix) as statuses:
        async with running_worker(settings) as worker:
            worker_id = worker.worker_id
            await statuses.until(online_and_ready(statuses, worker_id))
            listed = [t for t in worker.registry.tools() if t.origin == "mcp:devices"]
            assert listed
            await statuses.until(
                lambda: statuses.server("devices", worker_id).get("state") == "ready"
            )
        await statuses.until(lambda: statuses.server("devices", worker_id)["state"] == "stopped")
    names = {name for t in listed for name in (t.name, t.qualified_name)}
    shown = [name for name in names for p in statuses.payloads if json.dumps(name).encode() in p]
    assert shown == []
    assert statuses.server("devices", worker_id)["tool_count"] == len(listed)
