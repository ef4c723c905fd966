"""MCP servers that misbehave for real: slow, failing, crashing, hanging, noisy, changing.

Every server here is a real process (tests/support/servers/misbehaving.py) killed and
restarted for real; every wait is bounded and on an event (a reply, a retained
status message, a log record). Timings are printed; the only ones asserted are bounds
with a wide margin: a reply is awaited at most `AT_ONCE_S` past its call's deadline, and
a call to a server known to be gone answers `unavailable` within it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.harness import Broker, make_settings, measured, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller, reply_topic_for
from tests.support.processes import start_http_demo, stop_process
from toolbus.worker.service import Worker

SERVER = Path(__file__).parents[1] / "support" / "servers" / "misbehaving.py"


def misbehaving(state: Path, **env: str) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {"TB_STATE_DIR": str(state), **env},
    }


AT_ONCE_S = 2.0  # "unavailable at once", and the margin a timed-out call may take


async def call(
    client: Caller,
    worker: Worker,
    tool: str,
    arguments: dict[str, Any] | None = None,
    *,
    wait_s: float = 60,
    **extra: Any,
) -> dict[str, Any]:
    return await client.call_tool(worker.topics, tool, arguments or {}, wait_s=wait_s, **extra)


async def timed(reply: Awaitable[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    """The reply and how long it took, in seconds."""
    began = time.monotonic()
    answer = await reply
    return answer, time.monotonic() - began


class ServerStates:
    """The retained `{prefix}/status/servers/{name}/{worker_id}` messages, as they arrive."""

    def __init__(self, client: Caller, worker: Worker, name: str) -> None:
        self.client, self.topic = client, worker.topics.server_status(name, worker.worker_id)

    async def until(self, state: str, timeout_s: float = 30) -> dict[str, Any]:
        await self.client.subscribe(self.topic)
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.client.messages.get()
                if message.topic.value == self.topic:
                    status: dict[str, Any] = json.loads(message.payload)
                    if status["state"] == state:
                        return status


@pytest_asyncio.fixture
async def caller_for_faults(broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url) as c:
        yield c


async def test_startup_retries_until_the_server_comes_up(broker: Broker, tmp_path: Path) -> None:
    settings = make_settings(
        broker, mcpServers={"flaky": misbehaving(tmp_path, TB_FAIL_STARTS="2")}
    )
    with watching("toolbus.mcp", "MCP connection succeeded on attempt") as succeeded:
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"flaky": "ready"}
            assert succeeded.seen.is_set()
    assert (tmp_path / "starts").read_text() == "3"
    [connected] = [r for r in succeeded.records if "succeeded on attempt" in r.getMessage()]
    assert (vars(connected)["server"], vars(connected)["attempt"]) == ("flaky", 3)
    failures = [
        r for r in succeeded.records if "attempt" in r.getMessage() and "failed (" in r.getMessage()
    ]
    assert [(r.levelno, vars(r)["attempt"]) for r in failures] == [
        (logging.WARNING, 1),
        (logging.WARNING, 2),
    ]
    assert all(vars(r)["retry_in_s"] >= 0 and vars(r)["error"] for r in failures)


async def test_startup_failure_degrades_then_recovers_in_the_background(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"late": misbehaving(tmp_path, TB_FAIL_STARTS="5")})
    with (
        watching("toolbus.mcp", "MCP connection failed after", logging.ERROR) as failed,
        watching("toolbus.service", "mcp server state") as changes,
    ):
        async with running_worker(settings) as worker:
            assert worker.mcp.states() == {"late": "down"} and failed.seen.is_set()
            down = vars(failed.records[-1])
            assert (down["server"], down["attempts"]) == ("late", 3)
            assert "echo" in down["tools"]  # names the tools it still serves
            assert (await call(caller_for_faults, worker, "echo", {"text": "x"}))["ok"]
            status = await ServerStates(caller_for_faults, worker, "late").until("ready")
            assert status["tool_count"] >= 1
            assert (await call(caller_for_faults, worker, "work", {"value": "now"}))["result"][
                "text"
            ] == "did now"
    assert int((tmp_path / "starts").read_text()) == 6
    # Each state change is a line with the server, its state and why.
    states = [vars(r) for r in changes.records if r.getMessage() == "mcp server state"]
    assert [s["state"] for s in states if s["server"] == "late"][-3:] == [
        "down",
        "ready",
        "stopped",
    ]
    [down] = [s for s in states if s["state"] == "down"]
    assert down["error"]


async def test_start_up_never_waits_on_mcp(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(
        broker, mcpServers={"slow": misbehaving(tmp_path, TB_SLOW_START_S="3")}
    )
    started = time.monotonic()
    async with running_worker(settings, wait_mcp=False) as worker:
        measured(
            f"worker subscribed {time.monotonic() - started:.2f} s after start with an MCP server taking 3 s"
        )
        assert worker.mcp.states() == {"slow": "connecting"}
        assert (await call(caller_for_faults, worker, "echo", {"text": "x"}))[
            "ok"
        ]  # local tools live at once
        # A call for the slow server's tool waits for it, within its own deadline...
        too_short = await call(caller_for_faults, worker, "work", {"value": "x"}, timeout_s=0.3)
        assert too_short["error"]["code"] == "unavailable" and too_short["error"]["details"][
            "servers"
        ] == ["slow"]
        waited = await call(caller_for_faults, worker, "work", {"value": "x"}, timeout_s=30)
        assert waited["ok"], waited


async def test_crash_mid_call_is_unavailable_and_the_session_comes_back(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(
        broker, mcpServers={"crashy": misbehaving(tmp_path, TB_CRASH_ON_CALL="2")}
    )
    async with running_worker(settings) as worker:
        states = ServerStates(caller_for_faults, worker, "crashy")
        await states.until("ready")  # from here on every change arrives, in order
        assert (await call(caller_for_faults, worker, "work", {"value": "1"}))["ok"]
        began = time.monotonic()
        crashed, took_s = await timed(call(caller_for_faults, worker, "work", {"value": "2"}))
        measured(f"call to a server that exits mid-call answered unavailable after {took_s:.3f} s")
        assert (
            crashed["error"]["code"] == "unavailable"
            and crashed["error"]["details"]["server"] == "crashy"
        )
        assert took_s < AT_ONCE_S
        await states.until("degraded")  # the call may be answered before the state changes
        await states.until("ready")
        measured(f"crash to recovery (session re-initialized): {time.monotonic() - began:.3f} s")
        assert (await call(caller_for_faults, worker, "work", {"value": "3"}))["ok"]

        exiting, took_s = await timed(call(caller_for_faults, worker, "exit_now"))
        assert exiting["error"]["code"] == "unavailable" and took_s < AT_ONCE_S
        await states.until("degraded")
        await states.until("ready")
        # A real signal from outside, between calls.
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        await states.until("degraded")
        await states.until("ready")
        assert (await call(caller_for_faults, worker, "work", {"value": "4"}))["ok"]
        assert worker.mcp.servers["crashy"].connects == 4


async def test_hung_calls_time_out_and_the_server_is_told(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"hung": misbehaving(tmp_path)})
    async with running_worker(settings) as worker:
        # Each reply is awaited only a little past its call's deadline.
        hung, took_s = await timed(
            call(caller_for_faults, worker, "hang", timeout_s=0.5, wait_s=0.5 + AT_ONCE_S)
        )
        measured(f"hung call with a 0.5 s deadline came back as timeout after {took_s:.3f} s")
        assert hung["error"]["code"] == "timeout" and took_s >= 0.5
        stubborn = await call(
            caller_for_faults,
            worker,
            "stubborn",
            {"seconds": 1.0},
            timeout_s=0.2,
            wait_s=0.2 + AT_ONCE_S,
        )
        assert stubborn["error"]["code"] == "timeout"
        # notifications/cancelled reached the server (it ignored it, as this one does)...
        counted = await call(caller_for_faults, worker, "cancellations")
        assert counted["ok"], counted["error"]
        assert counted["result"]["text"] == "1"
        # ...and its late answer does not disturb the session.
        assert (await call(caller_for_faults, worker, "work", {"value": "after"}))["ok"]


@pytest.mark.parametrize(("limits", "most"), [({"server": 2}, 2), ({"server": 4, "tool": 1}, 1)])
async def test_concurrency_limits_per_server_and_per_tool(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path, limits: dict[str, int], most: int
) -> None:
    server = {**misbehaving(tmp_path), "max_in_flight": limits["server"]}
    tools = {"overlap": {"max_in_flight": limits["tool"]}} if "tool" in limits else {}
    settings = make_settings(broker, mcpServers={"narrow": server}, tools=tools)
    async with running_worker(settings) as worker:
        replies = await asyncio.gather(
            *(call(caller_for_faults, worker, "overlap", {"hold_s": 0.2}) for _ in range(8))
        )
        assert all(r["ok"] for r in replies)  # the rest waited, within their deadline
        assert max(int(r["result"]["text"]) for r in replies) == most


async def test_garbage_on_stdout_does_not_break_the_session(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"noisy": misbehaving(tmp_path, TB_GARBAGE="1")})
    with watching("toolbus.mcp", "not JSON-RPC", logging.WARNING) as complaints:
        async with running_worker(settings) as worker:
            assert (await call(caller_for_faults, worker, "work", {"value": "before"}))["ok"]
            noisy = await call(caller_for_faults, worker, "noisy", {"value": "x"})
            assert noisy["ok"] and noisy["result"]["text"] == "clean x"
            assert (await call(caller_for_faults, worker, "work", {"value": "after"}))["ok"]
            assert worker.mcp.servers["noisy"].bad_stdout_lines == 3, [
                r.getMessage() for r in complaints.records
            ]
    shown = [r.getMessage() for r in complaints.records]
    assert len(shown) == 3 and any("Welcome to the misbehaving server" in line for line in shown)


async def test_tool_list_changes_without_dropping_calls(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"shifty": misbehaving(tmp_path)})
    async with running_worker(settings) as worker:
        changed = asyncio.Event()
        worker.registry.listeners.append(changed.set)
        in_flight = asyncio.create_task(
            call(caller_for_faults, worker, "stubborn", {"seconds": 0.5}), name="in-flight"
        )
        assert (await call(caller_for_faults, worker, "add_tool", {"name": "fresh_tool"}))["ok"]
        async with asyncio.timeout(10):
            while "fresh_tool" not in worker.registry:
                changed.clear()
                await changed.wait()
        fresh = await call(
            caller_for_faults, worker, "FreshTool", {"text": "hi"}
        )  # normalization tables too
        assert fresh["ok"] and fresh["result"]["text"] == "fresh_tool: hi"
        assert (await call(caller_for_faults, worker, "remove_tool", {"name": "fresh_tool"}))["ok"]
        async with asyncio.timeout(10):
            while "fresh_tool" in worker.registry:
                changed.clear()
                await changed.wait()
        assert (await call(caller_for_faults, worker, "fresh_tool", {"text": "hi"}))["error"][
            "code"
        ] == "unknown_tool"
        late = await in_flight
        assert late["ok"] and late["result"]["text"] == "late"


async def test_non_text_content_is_carried(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"media": misbehaving(tmp_path)})
    async with running_worker(settings) as worker:
        reply = await call(caller_for_faults, worker, "picture")
        assert reply["ok"] and reply["result"]["text"] == "a tiny png"
        [image] = reply["result"]["content"]
        assert image["type"] == "image" and image["mime_type"] == "image/png"
        assert image["data"].startswith("iVBORw0KGgo")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    found.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


async def test_1000_hung_calls_all_time_out_and_leak_nothing(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, concurrency=256, mcpServers={"hung": misbehaving(tmp_path)})
    async with running_worker(settings) as worker:
        for _ in range(3):  # warm every path once before counting
            assert (
                await call(caller_for_faults, worker, "hang", timeout_s=0.2, wait_s=0.2 + AT_ONCE_S)
            )["error"]["code"] == "timeout"
        fds, kids = open_fds(), children()
        began = time.monotonic()
        replies = await asyncio.gather(
            *(call(caller_for_faults, worker, "hang", timeout_s=1.0) for _ in range(1000))
        )
        measured(
            f"1000 hung calls (1 s deadline, 256 in flight, 32 per server) answered in {time.monotonic() - began:.1f} s"
        )
        assert [r["error"]["code"] for r in replies] == ["timeout"] * 1000
        assert children() == kids
        assert open_fds() == fds


async def test_http_server_restart_reinitializes_the_session(
    broker: Broker, caller_for_faults: Caller
) -> None:
    from tests.support.harness import free_port

    port = free_port()
    server = await start_http_demo(port)
    try:
        settings = make_settings(
            broker,
            mcp={
                "startup_base_delay_s": 0.05,
                "recovery_max_delay_s": 0.5,
                "health_interval_s": 0.2,
            },
            mcpServers={"web": {"url": f"http://127.0.0.1:{port}/mcp", "connect_timeout_s": 5}},
        )
        async with running_worker(settings) as worker:
            states = ServerStates(caller_for_faults, worker, "web")
            assert (await call(caller_for_faults, worker, "list_devices"))["ok"]
            # 2026-07-28 over HTTP: no `ping` there, its health is asked with server/discover.
            assert worker.mcp.servers["web"].protocol_version == "2026-07-28"
            await stop_process(server)
            began = time.monotonic()
            await states.until("degraded")
            down, took_s = await timed(call(caller_for_faults, worker, "list_devices"))
            assert (
                down["error"]["code"] == "unavailable"
                and down["error"]["details"]["server"] == "web"
            )
            assert took_s < AT_ONCE_S  # a degraded server's calls fail at once
            server = await start_http_demo(port)
            await states.until("ready")
            measured(
                f"HTTP server killed and restarted: session re-initialized after {time.monotonic() - began:.2f} s"
            )
            assert (await call(caller_for_faults, worker, "list_devices"))["ok"]
            assert worker.mcp.servers["web"].connects == 2
    finally:
        await stop_process(server)


async def test_stdio_servers_inherit_the_otel_settings(
    broker: Broker, caller_for_faults: Caller, tmp_path: Path
) -> None:
    from toolbus.observability.sdk import child_environment

    inherited = child_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SERVICE_NAME": "w", "HOME": "/"}
    )
    assert inherited == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}
    server = misbehaving(tmp_path)
    server["env"]["OTEL_TRACES_SAMPLER"] = "always_off"  # the server's own env wins
    settings = make_settings(broker, mcpServers={"child": server})
    child_env = {**inherited, "OTEL_TRACES_SAMPLER": "always_on"}
    async with running_worker(settings, child_env=child_env) as worker:
        endpoint = await call(
            caller_for_faults, worker, "env_value", {"name": "OTEL_EXPORTER_OTLP_ENDPOINT"}
        )
        sampler = await call(
            caller_for_faults, worker, "env_value", {"name": "OTEL_TRACES_SAMPLER"}
        )
        assert endpoint["result"]["text"] == "http://x:4318"
        assert sampler["result"]["text"] == "always_off"


async def test_a_call_refused_while_its_server_is_down_can_be_sent_again_under_its_id(
    broker: Broker, caller_for_faults: Caller
) -> None:
    """`unavailable` because the session was down means the tool was never asked: the
    id is not answered for good, so the requester's retry runs once the server is back
    (it used to be replayed `unavailable` for `dedup_ttl_s`)."""
    from tests.support.harness import free_port

    port = free_port()
    server = await start_http_demo(port)
    try:
        settings = make_settings(
            broker,
            mcp={"startup_base_delay_s": 0.05, "recovery_max_delay_s": 0.5},
            mcpServers={"web": {"url": f"http://127.0.0.1:{port}/mcp", "connect_timeout_s": 5}},
        )
        switch = {"device_name": "Switch One", "command": "on"}
        async with running_worker(settings) as worker:
            assert settings.dedup_store == "memory"  # the default: ids are deduplicated
            states = ServerStates(caller_for_faults, worker, "web")
            # One client: without a caller identity its reply topic is part of the key.
            reply = reply_topic_for(worker.topics)
            await stop_process(server)
            await states.until("degraded")
            down = await call(
                caller_for_faults,
                worker,
                "control_zwave_device",
                switch,
                id="b1",
                reply_topic=reply,
            )
            assert down["error"]["code"] == "unavailable" and down["replayed"] is False
            server = await start_http_demo(port)
            await states.until("ready")
            again = await call(
                caller_for_faults,
                worker,
                "control_zwave_device",
                switch,
                id="b1",
                reply_topic=reply,
            )
            assert again["ok"] and again["replayed"] is False, again
            # Answered for good now: a third send is the stored reply, not a second run.
            third = await call(
                caller_for_faults,
                worker,
                "control_zwave_device",
                switch,
                id="b1",
                reply_topic=reply,
            )
            assert third["ok"] and third["replayed"] is True
    finally:
        await stop_process(server)
