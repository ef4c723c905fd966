"""A call with an id on its way through the worker (issue 23's review): prepared once,
claimed with what was prepared, then run, refused or replayed; stopped while it waits;
and what operators see of it (the call line, the metrics, the spans).

In-process (`Pipeline.handle` and a `ListPublisher`), against the memory store and a real
Redis; test_repeats.py says what a repeat is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.trace import StatusCode

from tests.calls.test_pipeline import REPLY, Rig, rig_for, standard_rig
from tests.dedup.test_repeats import assert_id_reused, send, store_for
from tests.observability.test_logs import call_lines, written
from tests.support.harness import RedisServer, metric_points
from tests.support.tools import Probe, probe_tools
from toolbus.dedup import DedupStore, MemoryStore, fingerprint
from toolbus.dedup.store import Claim, Started
from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.registry import Tool
from toolbus.wire.contracts import ToolResult


class Observed:
    """A dedup store that tells the test what its users do: `waiting` is set once a call
    waits for a running twin's reply; `on_claim` runs before each claim."""

    def __init__(self, store: DedupStore) -> None:
        self.store = store
        self.waiting = asyncio.Event()
        self.on_claim: Callable[[], None] = lambda: None
        self.claimed: list[str] = []  # the fingerprints claimed, in order
        self.finishing = asyncio.Event()  # a run's reply is being written
        self.hold: asyncio.Event | None = None  # when set, `finish` waits for it

    async def __aenter__(self) -> Observed:
        await self.store.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.__aexit__(*exc)

    async def claim(
        self, key: str, ttl_s: float, *, fingerprint: str = "", delivery: str | None = None
    ) -> Claim:
        self.on_claim()
        self.claimed.append(fingerprint)
        return await self.store.claim(key, ttl_s, fingerprint=fingerprint, delivery=delivery)

    async def take_over(
        self,
        key: str,
        previous: Started,
        ttl_s: float,
        *,
        fingerprint: str = "",
        delivery: str | None = None,
    ) -> bool:
        return await self.store.take_over(
            key, previous, ttl_s, fingerprint=fingerprint, delivery=delivery
        )

    async def supersede(
        self,
        key: str,
        previous: Claim,
        ttl_s: float,
        *,
        fingerprint: str,
        delivery: str | None = None,
    ) -> bool:
        return await self.store.supersede(
            key, previous, ttl_s, fingerprint=fingerprint, delivery=delivery
        )

    async def finish(
        self,
        key: str,
        reply: bytes,
        ttl_s: float,
        *,
        fingerprint: str = "",
        summary: bytes | None = None,
        delivery: str | None = None,
    ) -> None:
        self.finishing.set()
        if self.hold is not None:
            await self.hold.wait()
        await self.store.finish(
            key, reply, ttl_s, fingerprint=fingerprint, summary=summary, delivery=delivery
        )

    async def remember_cancel(self, key: str, ttl_s: float) -> None:
        await self.store.remember_cancel(key, ttl_s)

    async def release(self, key: str, *, fingerprint: str = "") -> None:
        await self.store.release(key, fingerprint=fingerprint)

    def held_bytes(self) -> int:
        return self.store.held_bytes()

    def gave_way(self) -> Mapping[str, int]:
        return self.store.gave_way()

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = "") -> bytes | None:
        self.waiting.set()
        return await self.store.wait(key, timeout_s, fingerprint=fingerprint)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> Observed:
    return Observed(store_for(request.param, redis_server))


@pytest_asyncio.fixture
async def rig(store: Observed) -> AsyncIterator[Rig]:
    built = standard_rig(store=store)
    async with built.pipeline:
        yield built


class StartsLater:
    """MCP servers still starting, for good; says when a call waits for them."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()

    def unsettled(self) -> list[str]:
        return ["slow"]

    def states(self) -> dict[str, str]:
        return {"slow": "starting"}

    async def wait_settled(self) -> None:
        self.waiting.set()
        await asyncio.Event().wait()  # never: the call's deadline or a stop ends the wait


async def stopped(rig: Rig, handling: asyncio.Task[None], waiting: asyncio.Event) -> None:
    """Once `handling` waits (`waiting`), the worker stops and cancels it; it must end
    by answering, not cancelled."""
    async with asyncio.timeout(5):
        await waiting.wait()
    rig.pipeline.stopping()
    handling.cancel()
    async with asyncio.timeout(5):
        await handling


# -- a stop while a call with an id waits --------------------------------------------------


async def test_a_call_with_an_id_stopped_while_servers_start_is_answered_unavailable(
    rig: Rig,
) -> None:
    """Its tool may belong to a server still starting: it waits for them before its claim;
    a stop answers it `unavailable`, as it does a call without an id, with one call line."""
    starting = StartsLater()
    rig.pipeline.executor._startup = starting
    body = {"id": "s1", "tool": "slow_tool", "arguments": {}}
    with written("json", "toolbus.execute") as stream:
        await stopped(rig, asyncio.create_task(rig.request(None, body)), starting.waiting)
    reply = rig.reply()
    assert reply["id"] == "s1" and reply["error"]["code"] == "unavailable"
    assert [line["outcome"] for line in call_lines(stream)] == ["unavailable"]
    # Nothing was claimed: the id is free for another request.
    rig.pipeline.executor._startup = None
    again = await send(rig, {"id": "s1", "tool": "echo", "arguments": {"text": "x"}})
    assert again["ok"] and again["replayed"] is False


async def test_a_repeat_stopped_while_it_waits_for_its_running_twin_is_answered_unavailable(
    rig: Rig, store: Observed
) -> None:
    """A repeat of a call still running waits for that call's reply; a stop answers the
    repeat `unavailable` and leaves the twin's claim alone: the twin's reply stays the
    id's answer, and the tool ran once."""
    first = asyncio.create_task(rig.request("gate", {"id": "t1"}), name="twin")
    await rig.probe.wait_active(1)
    await stopped(rig, asyncio.create_task(rig.request("gate", {"id": "t1"})), store.waiting)
    assert rig.reply()["error"]["code"] == "unavailable"
    rig.probe.release.set()
    async with asyncio.timeout(5):
        await first
    assert rig.reply()["result"]["text"] == "released"
    replayed = await send(rig, {"id": "t1", "tool": "gate"})
    assert replayed["replayed"] and replayed["result"]["text"] == "released"
    assert rig.probe.calls == 1


# -- prepared once: what is compared is what runs ----------------------------------------


async def test_a_call_with_an_id_is_normalized_once(caplog: pytest.LogCaptureFixture) -> None:
    probe = Probe()
    maps = {"echo": {"words": "text"}}
    mapped = rig_for(probe_tools(probe), probe, store=MemoryStore("w1"), argument_maps=maps)
    async with mapped.pipeline:
        with caplog.at_level(logging.DEBUG, logger="toolbus"):
            reply = await mapped.call("echo", {"id": "n1", "arguments": {"words": "hi"}})
    assert reply["ok"] and reply["result"]["structured"]["text"] == "hi"
    assert [e["rule"] for e in reply["normalized"]] == ["static_map"]  # the report, as ever
    normalized = [r for r in caplog.records if r.getMessage().startswith("normalized echo")]
    assert len(normalized) == 1


def device_tool(properties: dict[str, Any], received: list[dict[str, Any]]) -> Tool:
    """An MCP-like tool (its keys respelled to the schema's) that keeps what it is given."""

    async def invoke(arguments: dict[str, Any], context: CallContext = DETACHED) -> ToolResult:
        received.append(arguments)
        return ToolResult(text="done")

    return Tool(
        name="switch",
        description="",
        input_schema={"type": "object", "properties": properties},
        invoke=invoke,
        origin="mcp:devices",
        server="devices",
        rename_arguments=True,
    )


async def test_the_fingerprint_claimed_is_of_the_arguments_the_tool_gets(
    rig: Rig, store: Observed
) -> None:
    """The server's tools change while the claim awaits the store (`tools/list_changed`):
    the call runs as it was prepared and compared, not as the new schema would have it."""
    received: list[dict[str, Any]] = []
    registry = rig.pipeline.executor.registry
    registry.replace_origin("mcp:devices", [device_tool({"deviceName": {}}, received)])

    def schema_changes() -> None:
        registry.replace_origin("mcp:devices", [device_tool({"device_name": {}}, received)])

    store.on_claim = schema_changes
    reply = await send(rig, {"id": "f1", "tool": "switch", "arguments": {"device_name": "x"}})
    assert reply["ok"]
    assert received == [{"deviceName": "x"}]  # as prepared, before the change
    assert store.claimed == [fingerprint("switch", received[0])]


# -- what operators see ------------------------------------------------------------------


async def test_an_id_reused_is_one_call_line_and_counted(rig: Rig) -> None:
    """An agent looping on a reused id shows in the log and the metrics as any refusal."""
    assert (await send(rig, {"id": "r1", "tool": "echo", "arguments": {"text": "x"}}))["ok"]
    with written("json", "toolbus.execute") as stream:
        reply = await send(rig, {"id": "r1", "tool": "echo", "arguments": {"text": "y"}})
    assert_id_reused(reply)
    [line] = call_lines(stream)
    assert (line["call_id"], line["tool"], line["outcome"]) == ("r1", "echo", "bad_request")
    assert rig.counted("toolbus.calls", tool="echo", outcome="bad_request") == 1
    [execute] = [
        s
        for s in rig.spans.get_finished_spans()
        if s.context and format(s.context.trace_id, "032x") == reply["trace_id"]
        if s.name.startswith("execute_tool ")
    ]
    assert execute.status.status_code is StatusCode.ERROR
    assert execute.attributes is not None and execute.attributes["error.type"] == "bad_request"


async def test_servers_still_starting_is_one_call_line_and_counted(rig: Rig) -> None:
    rig.pipeline.executor._startup = StartsLater()
    body = {"id": "u1", "tool": "slow_tool", "arguments": {}, "timeout_s": 0.05}
    with written("json", "toolbus.execute") as stream:
        reply = await send(rig, body)
    assert reply["error"]["code"] == "unavailable"
    [line] = call_lines(stream)
    assert (line["call_id"], line["outcome"]) == ("u1", "unavailable")
    assert rig.counted("toolbus.calls", outcome="unavailable") == 1


async def test_a_replay_is_one_traced_message_that_says_so(rig: Rig) -> None:
    """A replayed reply ran nothing: its trace is the message's span and the call's
    `execute_tool` (prepared to be compared, not run), both marked a replay, and the
    reply's send; a stored error fails them as the first run's did."""
    for ident, tool, arguments, code in [
        ("p1", "echo", {"text": "x"}, None),
        ("p2", "explode", {}, "tool_error"),
    ]:
        first = await send(rig, {"id": ident, "tool": tool, "arguments": arguments})
        again = await send(rig, {"id": ident, "tool": tool, "arguments": arguments})
        assert again["replayed"] and (again.get("error") or {}).get("code") == code
        assert first["trace_id"] != again["trace_id"]
        spans = [
            s
            for s in rig.spans.get_finished_spans()
            if s.context and format(s.context.trace_id, "032x") == again["trace_id"]
        ]
        names = sorted(s.name for s in spans)
        assert names == [f"execute_tool {tool}", "process tb/call", f"send {REPLY}"]
        for span in (s for s in spans if not s.name.startswith("send ")):
            assert span.attributes is not None
            assert span.attributes["toolbus.dedup.replayed"] is True
            if code is None:
                assert span.status.status_code is StatusCode.UNSET
            else:
                assert span.status.status_code is StatusCode.ERROR
                assert span.attributes["error.type"] == code
    first_run = [s for s in rig.spans.get_finished_spans() if s.name == "process tb/call"]
    assert first_run[0].attributes is not None
    assert "toolbus.dedup.replayed" not in first_run[0].attributes


async def test_a_replay_with_trace_steps_exports_no_span_without_its_parent(
    redis_server: RedisServer,
) -> None:
    """With `trace_steps`, preparing a call (before its claim) makes `normalize` and
    `validate` spans; a replay ends their `execute_tool` too, so no span is orphaned."""
    probe = Probe()
    traced = rig_for(
        probe_tools(probe), probe, store=store_for("redis", redis_server), trace_steps=True
    )
    async with traced.pipeline:
        body = {"id": "o1", "tool": "echo", "arguments": {"text": "x"}}
        assert (await send(traced, body))["replayed"] is False
        again = await send(traced, body)
    assert again["replayed"] is True
    spans = [
        s
        for s in traced.spans.get_finished_spans()
        if s.context and format(s.context.trace_id, "032x") == again["trace_id"]
    ]
    assert {"normalize", "validate", "execute_tool echo"} <= {s.name for s in spans}
    exported = {s.context.span_id for s in spans if s.context}
    for span in spans:  # the caller sent no traceparent: every parent is exported here
        assert span.parent is None or span.parent.span_id in exported, span.name


# -- a repeat past its deadline ------------------------------------------------------------


def past() -> int:
    """A `deadline_ms` already gone: the request waited too long in some queue."""
    return int(time.time() * 1000) - 1


async def test_a_repeat_of_a_finished_call_past_its_deadline_is_replayed(rig: Rig) -> None:
    """Its id ran: "not run" would be false, and a client resending under a new id would
    run the tool twice. The stored reply is true whenever it arrives."""
    body = {"id": "x1", "tool": "echo", "arguments": {"text": "x"}}
    first = await send(rig, body)
    again = await send(rig, {**body, "deadline_ms": past()})
    assert again["replayed"] is True and again["result"] == first["result"]


async def test_a_call_past_its_deadline_leaves_its_id_free(rig: Rig) -> None:
    """Never run: `timeout` (expired), and its id is free for the request sent again."""
    body = {"id": "x2", "tool": "echo", "arguments": {"text": "x"}}
    expired = await send(rig, {**body, "deadline_ms": past()})
    assert expired["error"]["code"] == "timeout" and expired["error"]["details"]["expired"]
    again = await send(rig, body)
    assert again["ok"] and again["replayed"] is False


async def test_a_repeat_past_its_deadline_of_a_call_still_running_does_not_wait(
    rig: Rig,
) -> None:
    """The twin runs on: the repeat says so at once (`still_running`), not "not run"."""
    first = asyncio.create_task(rig.request("gate", {"id": "x3"}))
    await rig.probe.wait_active(1)
    late = await send(rig, {"id": "x3", "tool": "gate", "deadline_ms": past()})
    assert late["error"]["code"] == "timeout" and late["error"]["details"]["still_running"]
    rig.probe.release.set()
    async with asyncio.timeout(5):
        await first
    assert rig.reply()["result"]["text"] == "released" and rig.probe.calls == 1


def duration_sum(rig: Rig, tool: str) -> float:
    """The seconds `toolbus.call.duration` holds for `tool`."""
    return sum(
        point.sum
        for point in metric_points(rig.metrics, "toolbus.call.duration")
        if isinstance(point, HistogramDataPoint) and (point.attributes or {}).get("tool") == tool
    )


# -- the time a caller waited --------------------------------------------------------------


async def test_a_repeat_that_waited_for_its_twin_logs_and_meters_the_wait(rig: Rig) -> None:
    """A `timeout` after waiting for a running twin took that long for its caller: the
    call line, the duration metric and the slow-call warning all say so."""
    rig.pipeline.executor._slow_call_ms = 100
    first = asyncio.create_task(rig.request("gate", {"id": "w1"}))
    await rig.probe.wait_active(1)
    with written("json", "toolbus.execute") as stream:
        late = await send(rig, {"id": "w1", "tool": "gate", "timeout_s": 0.3})
    assert late["error"]["details"]["still_running"]
    [line] = call_lines(stream)
    assert line["outcome"] == "timeout" and line["duration_ms"] >= 300 and line["slow"] is True
    assert duration_sum(rig, "gate") >= 0.3
    rig.probe.release.set()
    async with asyncio.timeout(5):
        await first


# -- a stop while the reply is recorded ----------------------------------------------------


async def test_a_stop_while_the_reply_is_recorded_still_sends_it(rig: Rig, store: Observed) -> None:
    """The tool ran: a stop while its record is written waits for the record (bounded)
    and sends the reply; a repeat then gets it again."""
    store.hold = asyncio.Event()
    body = {"id": "c1", "tool": "echo", "arguments": {"text": "x"}}
    handling = asyncio.create_task(rig.request(None, body))
    async with asyncio.timeout(5):
        await store.finishing.wait()
    rig.pipeline.stopping()
    handling.cancel()
    store.hold.set()
    async with asyncio.timeout(5):
        await handling
    assert rig.reply()["ok"]
    store.hold = None
    again = await send(rig, body)
    assert again["replayed"] is True
