"""`toolbus serve --processes N` as a real process: N children on the shared subscription,
a killed child restarted, SIGTERM draining every child, a parent's death not leaving
children behind, and the refusals (no shared group; a child the broker refuses).

Which child answered is read from the recording tool's lines (key and pid of each run);
which children exist from /proc; a child's end from a pidfd (any process, not only ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import ValidationError

from tests.cli.test_cli import cli_env, run_cli
from tests.support.fleet import Executions, recording_env
from tests.support.harness import Broker
from tests.support.mqtt import Caller
from toolbus.backends.mcp import McpBackend
from toolbus.client.client import Client, Retry
from toolbus.config import Settings
from toolbus.worker.exit_codes import EXIT_BROKER, EXIT_OK, EXIT_USAGE
from toolbus.worker.supervisor import MCP_CLOSE_BOUND_S, Supervisor

BOUND_S = 60.0  # a start, a restart, a drain: each within this
ONE_SEND = Retry(attempts=1, interval_s=BOUND_S)  # a lost call fails the test, never re-sent


class Supervised:
    """`toolbus serve --processes N` (no config file: the environment says everything);
    every line its children and it write is read, as events."""

    def __init__(self, broker_url: str, env: dict[str, str], processes: int = 2) -> None:
        self.flags = ("--broker", broker_url, "--processes", str(processes))
        self.env = env
        self.events: list[str] = []
        self._seen = asyncio.Condition()
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pidfds: dict[int, int] = {}  # every child seen: killed at the end if still there

    async def __aenter__(self) -> Supervised:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolbus",
            "serve",
            *self.flags,
            env=self.env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read(), name="supervised-stderr")
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.proc is not None and self._reader is not None
        if self.proc.returncode is None:
            with contextlib.suppress(FileNotFoundError):  # it has just ended
                self.children()  # the latest ones too
            self.proc.kill()
        for fd in self._pidfds.values():  # a pidfd never signals a later process of that pid
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        async with asyncio.timeout(BOUND_S):
            await self.proc.wait()
            await self._reader  # ends when the last child's copy of the pipe closes

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace")
            with contextlib.suppress(ValueError):  # not JSON: the raw line
                text = str(json.loads(text).get("event", text))
            async with self._seen:
                self.events.append(text)
                self._seen.notify_all()

    def count(self, marker: str) -> int:
        return sum(marker in event for event in self.events)

    async def seen(self, marker: str, times: int) -> None:
        """Until `marker` has been logged `times` times (bounded)."""
        assert self._reader is not None
        reader = self._reader
        async with asyncio.timeout(BOUND_S), self._seen:
            await self._seen.wait_for(lambda: self.count(marker) >= times or reader.done())
        assert self.count(marker) >= times, self.events[-30:]

    async def ready(self, subscribed: int = 2) -> list[int]:
        """Once `subscribed` children have subscribed in all: the children's pids."""
        await self.seen("subscribed to", subscribed)
        return self.children()

    def children(self) -> list[int]:
        """The supervisor's child processes (its workers; MCP servers are theirs)."""
        assert self.proc is not None
        pid = self.proc.pid
        children = sorted(
            int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        )
        for child in children:
            if child not in self._pidfds:
                with contextlib.suppress(ProcessLookupError):
                    self._pidfds[child] = os.pidfd_open(child)
        return children

    async def exit_code(self) -> int:
        assert self.proc is not None
        async with asyncio.timeout(BOUND_S):
            return await self.proc.wait()


class Statuses:
    """The retained worker statuses as they change: (worker id, state) events; the
    `offline` of a clean stop (it says since when, the last will cannot) is `stopped`."""

    def __init__(self, caller: Caller, prefix: str) -> None:
        self.caller, self.topic = caller, f"{prefix}/status/workers/+"
        self.events: list[tuple[str, str]] = []
        self.latest: dict[str, str] = {}
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Statuses:
        await self.caller.subscribe(self.topic)
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
            worker_id = message.topic.value.rsplit("/", 1)[-1]
            payload = message.payload
            assert isinstance(payload, bytes)
            status = json.loads(payload)
            state = (
                "stopped" if status["state"] == "offline" and status["since"] else status["state"]
            )
            async with self._changed:
                self.events.append((worker_id, state))
                self.latest[worker_id] = state
                self._changed.notify_all()

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(BOUND_S), self._changed:
            await self._changed.wait_for(done)


async def ended(pid: int) -> None:
    """Until process `pid` has ended (its pidfd turns readable), bounded."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop, done = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(fd, done.set)
    try:
        async with asyncio.timeout(BOUND_S):
            await done.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest_asyncio.fixture
async def fleet(
    broker: Broker, caller: Caller, tmp_path: Path
) -> AsyncIterator[tuple[Supervised, Statuses, Client, Executions, str]]:
    """Two supervised children with worker id `{prefix}-w` (so `-w-1` and `-w-2`),
    subscribed; their statuses watched; a client."""
    prefix = f"procs{uuid.uuid4().hex[:8]}"
    env = recording_env(tmp_path, prefix, worker_id=f"{prefix}-w", shutdown_grace_s="20")
    async with (
        Statuses(caller, prefix) as statuses,
        Supervised(broker.url, env) as supervised,
        Client(broker.url, prefix=prefix, retry=ONE_SEND, timeout_s=BOUND_S) as client,
    ):
        await supervised.ready()
        yield supervised, statuses, client, Executions(tmp_path / "executions"), prefix


async def records(client: Client, keys: list[str], hold_s: float = 0.0) -> None:
    """The recording tool once per key, all at once; each answered ok (else it raises)."""
    replies = await asyncio.gather(
        *(client.call("record", {"key": key, "hold_s": hold_s}) for key in keys)
    )
    assert [reply.result.text for reply in replies if reply.result] == keys


async def test_both_children_answer_under_their_own_ids(
    fleet: tuple[Supervised, Statuses, Client, Executions, str],
) -> None:
    supervised, statuses, client, executions, prefix = fleet
    ids = {f"{prefix}-w-1", f"{prefix}-w-2"}
    await statuses.until(lambda: all(statuses.latest.get(i) == "online" for i in ids))
    assert set(statuses.latest) == ids

    keys = [f"both{n}" for n in range(20)]
    await records(client, keys)
    runs = [(key, pid) for key, pid in executions.lines() if key.startswith("both")]
    assert sorted(key for key, _ in runs) == sorted(keys)  # each once
    assert {pid for _, pid in runs} == set(supervised.children())  # the broker used both
    assert len(supervised.children()) == 2


async def test_a_killed_child_is_restarted_and_calls_go_on(
    fleet: tuple[Supervised, Statuses, Client, Executions, str],
) -> None:
    supervised, statuses, client, executions, prefix = fleet
    before = supervised.children()
    mark = len(statuses.events)
    os.kill(before[0], signal.SIGKILL)
    await ended(before[0])

    await supervised.seen("subscribed to", 3)  # the new child is up
    after = supervised.children()
    assert len(after) == 2 and before[0] not in after and before[1] in after
    # The new child took its slot's id: that id came back online.
    await statuses.until(lambda: any(state == "online" for _, state in statuses.events[mark:]))
    [back] = {i for i, state in statuses.events[mark:] if state == "online"}
    assert back in {f"{prefix}-w-1", f"{prefix}-w-2"}

    keys = [f"after{n}" for n in range(20)]
    await records(client, keys)
    pids = {pid for key, pid in executions.lines() if key.startswith("after")}
    assert pids == set(after)


async def test_sigterm_drains_every_child_and_the_parent_exits_0(
    fleet: tuple[Supervised, Statuses, Client, Executions, str],
) -> None:
    supervised, statuses, client, executions, prefix = fleet
    children = supervised.children()
    calls = asyncio.create_task(records(client, [f"slow{n}" for n in range(4)], hold_s=1.0))
    await supervised.seen("record started", 4)
    assert {pid for key, pid in executions.lines() if key.startswith("slow")} == set(children)

    assert supervised.proc is not None
    supervised.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(BOUND_S):
        await calls  # every call in flight answered ok
    assert await supervised.exit_code() == EXIT_OK
    await asyncio.gather(*(ended(pid) for pid in children))
    ids = {f"{prefix}-w-1", f"{prefix}-w-2"}
    await statuses.until(lambda: all(statuses.latest.get(i) == "stopped" for i in ids))


async def test_a_killed_parent_leaves_no_child_running(
    fleet: tuple[Supervised, Statuses, Client, Executions, str],
) -> None:
    supervised, statuses, _, _, prefix = fleet
    children = supervised.children()
    assert supervised.proc is not None
    supervised.proc.kill()
    await asyncio.gather(*(ended(pid) for pid in children))
    # Each drained (SIGTERM from the kernel) rather than died: its status says since when
    # it is offline, which only a clean stop does (the last will cannot know).
    ids = {f"{prefix}-w-1", f"{prefix}-w-2"}
    await statuses.until(lambda: all(statuses.latest.get(i) == "stopped" for i in ids))


async def test_children_refused_by_the_broker_stop_the_parent(tmp_path: Path) -> None:
    broker = Broker(tmp_path, passwords={"worker": "right-pw"})
    broker.start()
    try:
        env = cli_env("refused")
        env.update(TOOLBUS_BROKER_USERNAME="worker", TOOLBUS_BROKER_PASSWORD="wrong-pw")
        async with Supervised(broker.url, env) as supervised:
            assert await supervised.exit_code() == EXIT_BROKER
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("flags", "settings"),
    [
        (["--processes", "2"], {"TOOLBUS_SHARED_GROUP": ""}),
        ([], {"TOOLBUS_SHARED_GROUP": "", "TOOLBUS_PROCESSES": "2"}),
        (["--processes", "0"], {}),
    ],
    ids=["flag-without-group", "setting-without-group", "zero"],
)
async def test_processes_the_configuration_refuses(
    flags: list[str], settings: dict[str, str]
) -> None:
    env = {**cli_env("unused"), **settings}
    # Refused before any connect: no broker needed (one would be retried, past the bound).
    code, _, _ = await run_cli("serve", "--broker", "mqtt://127.0.0.1:9", *flags, env=env)
    assert code == EXIT_USAGE


def test_every_childs_http_port_must_exist() -> None:
    assert Settings(processes=2, http_port=65534).processes == 2
    with pytest.raises(ValidationError):
        Settings(processes=3, http_port=65534)  # the third child's would be 65536
    with pytest.raises(ValidationError):
        Settings(processes=3, metrics_port=65534)  # the deprecated alias means http_port


def test_each_child_has_its_own_id_and_http_port() -> None:
    supervisor = Supervisor(["true"], 3, worker_id="w", http_port=9100, stop_bound_s=1.0)
    assert [supervisor.child_env(i)["TOOLBUS_WORKER_ID"] for i in (1, 2, 3)] == [
        "w-1",
        "w-2",
        "w-3",
    ]
    ports = [supervisor.child_env(i)["TOOLBUS_HTTP_PORT"] for i in (1, 2, 3)]
    assert ports == ["9100", "9101", "9102"]
    unset = Supervisor(["true"], 2, worker_id=None, http_port=None, stop_bound_s=1.0)
    # each child makes its own id; it knows its supervisor, to end with it
    assert unset.child_env(1) == {**os.environ, "TOOLBUS_SUPERVISOR_PID": str(os.getpid())}


def test_the_stop_bound_covers_closing_the_mcp_servers() -> None:
    assert McpBackend.close_bound_s == MCP_CLOSE_BOUND_S
