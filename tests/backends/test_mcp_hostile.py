"""MCP servers that hurt the worker's other callers: floods, fragments, a racing restart.

Each server is a real process (tests/support/servers/misbehaving.py) behind a real worker and a
real mosquitto; every wait is bounded and on an event (a reply, a log record, a retained
status). Timings are printed, never asserted: the bound on re-lists is a count per
`RELIST_INTERVAL_S` of the time the flood took, whatever that time was.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.backends.test_mcp_faults import ServerStates, call, misbehaving
from tests.observability.test_metrics import points, value
from tests.support.harness import Broker, make_settings, measured, running_worker
from tests.support.logwait import watching
from tests.support.mqtt import Caller
from toolbus.backends.mcp.listing import RELIST_INTERVAL_S
from toolbus.backends.mcp.stdio import PARTIAL_LINE_S

FLOOD = 1000
FLOOD_GAP_S = 0.002  # the server's loop: a notification every 2 ms, as fast as 500/s


def cpu_s() -> float:
    """CPU seconds used by this process (the worker; the caller idles meanwhile)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


@pytest_asyncio.fixture
async def client(broker: Broker) -> AsyncIterator[Caller]:
    async with Caller(broker.url) as c:
        yield c


async def test_a_flood_of_list_changed_costs_a_few_relists_and_no_log_lines(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    settings = make_settings(broker, mcpServers={"loud": misbehaving(tmp_path)})
    with watching("toolbus.mcp", "mcp tools changed") as logged:
        async with running_worker(settings) as worker:
            changed = asyncio.Event()
            worker.registry.listeners.append(changed.set)
            began, cpu_began = time.monotonic(), cpu_s()
            flood = {"count": FLOOD, "gap_s": FLOOD_GAP_S}
            flooded = await call(client, worker, "list_flood", flood)
            assert flooded["ok"], flooded
            flood_s, flood_cpu_s = time.monotonic() - began, cpu_s() - cpu_began
            # Every notification came before that answer; a real change after them counts.
            assert (await call(client, worker, "add_tool", {"name": "fresh_tool"}))["ok"]
            async with asyncio.timeout(30):
                while "fresh_tool" not in worker.registry:
                    changed.clear()
                    await changed.wait()
            took_s = time.monotonic() - began
            served = await call(client, worker, "lists_served")
            lists = int(served["result"]["text"])
            assert (await call(client, worker, "fresh_tool", {"text": "hi"}))["ok"]
    changes = [vars(r) for r in logged.records if r.getMessage() == "mcp tools changed"]
    measured(
        f"{FLOOD} tools/list_changed {FLOOD_GAP_S * 1000:.0f} ms apart then one real change: "
        f"{lists} tools/list requests, {len(changes)} INFO lines in {took_s:.2f} s; worker CPU "
        f"during the flood {100 * flood_cpu_s / flood_s:.0f}% of a core"
    )
    # One at start-up; then at most one per interval while it lasted, and one queued.
    assert lists <= 3 + took_s / RELIST_INTERVAL_S, (lists, took_s)
    assert [(c["added"], c["removed"]) for c in changes] == [(["loud.fresh_tool"], [])]


async def next_status(
    client: Caller, topic: str, wanted: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first retained status on `topic` from now on that is `wanted`."""
    await client.subscribe(topic)
    async with asyncio.timeout(30):
        while True:
            message = await client.messages.get()
            if message.topic.value == topic:
                status: dict[str, Any] = json.loads(message.payload)
                if wanted(status):
                    return status


async def test_a_real_change_shows_in_the_servers_status_count(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    """A re-list changes a server's tools, not its state: its status still counts them
    right (at the next heartbeat), and still names none of them."""
    settings = make_settings(
        broker, status_interval_s=0.2, mcpServers={"shifty": misbehaving(tmp_path)}
    )
    async with running_worker(settings) as worker:
        topic = worker.topics.server_status("shifty", worker.worker_id)
        first = await next_status(client, topic, lambda s: s["state"] == "ready")
        assert first["tool_count"] == len(worker.mcp.servers["shifty"].tool_names)
        assert (await call(client, worker, "add_tool", {"name": "fresh_tool"}))["ok"]
        grown = await next_status(
            client, topic, lambda s: s["tool_count"] == first["tool_count"] + 1
        )
        assert grown["state"] == "ready" and "fresh_tool" not in json.dumps(grown)


async def test_a_fragment_without_newline_never_takes_the_next_answer(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    """Bytes that look like the start of an answer, and no newline after them: the next
    answer is read whole, whether it comes at once (glued on, taken off again) or after
    the line's time is up (dropped)."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    settings = make_settings(broker, mcpServers={"frag": misbehaving(tmp_path)})
    start = {"text": '{"jsonrpc": "2.0", "id": 9'}
    with (
        watching("toolbus.mcp", "unfinished", logging.WARNING) as dropped,
        watching("toolbus.mcp.frag", "fragment written") as written,
    ):
        async with running_worker(settings, meter=meter) as worker:
            assert (await call(client, worker, "fragment", start))["ok"]
            async with asyncio.timeout(30):
                await written.seen.wait()
            at_once = await call(client, worker, "work", {"value": "at once"}, wait_s=30)
            assert at_once["ok"] and at_once["result"]["text"] == "did at once", at_once

            dropped.seen.clear()
            assert (await call(client, worker, "fragment", start))["ok"]
            async with asyncio.timeout(PARTIAL_LINE_S + 30):
                await dropped.seen.wait()
            later = await call(client, worker, "work", {"value": "later"}, wait_s=30)
            assert later["ok"] and later["result"]["text"] == "did later", later
            assert worker.mcp.servers["frag"].bad_stdout_lines == 0  # nothing glued, nothing bad
            assert worker.mcp.states() == {"frag": "ready"}  # the session went on
    warnings = [r.getMessage() for r in dropped.records if "unfinished" in r.getMessage()]
    assert len(warnings) == 2 and "glued" in warnings[0] and "glued" not in warnings[1], warnings
    assert all(r.levelno == logging.WARNING for r in dropped.records if "unfinished" in r.msg)
    assert value(points(reader), "toolbus.mcp.stdout.partial_dropped", server="frag") == 2


async def test_a_call_while_a_session_closes_is_told_the_truth_then_served_again(
    broker: Broker, client: Caller, tmp_path: Path
) -> None:
    """The session ends (the server closed its stdout) while its process takes seconds
    to stop (deaf to stdin's end and to SIGTERM): a call meanwhile used to be refused as
    "MCP server mis is ready". It must say the server is not ready, and why."""
    settings = make_settings(
        broker,
        mcp={"startup_base_delay_s": 0.05, "recovery_max_delay_s": 0.5},
        mcpServers={"mis": misbehaving(tmp_path)},
    )
    async with running_worker(settings) as worker:
        states = ServerStates(client, worker, "mis")
        await states.until("ready")
        # Its answer is the event: the session is over, the process still being stopped.
        closed = await call(client, worker, "close_stdout")
        assert closed["error"]["code"] == "unavailable", closed
        racing = await call(client, worker, "work", {"value": "meanwhile"})
        error = racing["error"]
        assert error["code"] == "unavailable" and error["details"]["server"] == "mis"
        assert error["details"]["state"] == "degraded", error
        assert "is ready" not in error["message"]  # the words the issue saw
        await states.until("degraded")
        await states.until("ready")  # a new process, a new session
        again = await call(client, worker, "work", {"value": "again"})
        assert again["ok"] and again["result"]["text"] == "did again", again
        assert worker.mcp.servers["mis"].connects == 2
