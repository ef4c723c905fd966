"""The pipeline in-process: every error code, dead letters, 3.1.1 replies, trace publishing
(its log lines: test_logs.py).

No broker: messages go in as `Inbound` values and come out through a `ListPublisher`,
so each case costs milliseconds. What only a broker can show (properties on the wire,
reconnects, drain, flow control) stays in test_worker.py.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from tests.calls import test_rounds as rounds  # its cases, not collected again here
from tests.support.harness import ListPublisher, RedisServer, measured, metric_points
from tests.support.tools import Probe, probe_tools, quits
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.backends.local.functions import LocalTool, tool
from toolbus.calls.call import ReplyAddress
from toolbus.calls.inflight import Slots
from toolbus.calls.quotas import Quotas
from toolbus.config import Settings
from toolbus.dedup import DedupStore, MemoryStore, Once
from toolbus.dedup.kept import KeptReplies
from toolbus.dedup.redis import RedisStore
from toolbus.dedup.tokens import TokenStore
from toolbus.doors.envelope.encode import outbound_reply
from toolbus.doors.envelope.pipeline import Pipeline
from toolbus.observability.export import TraceCollector
from toolbus.observability.metrics import Metrics
from toolbus.transport.properties import publish_properties
from toolbus.wire.contracts import ErrorCode, Reply, ToolResult
from toolbus.wire.errors import InvalidArguments, ToolFailed
from toolbus.wire.messages import Inbound, Outbound, Unconfirmed
from toolbus.worker.wiring import build_executor, build_registry, topics_for

REPLY = "tb/reply/r1"
CORRELATION = b"\x00corr"


@tool
async def when_failed() -> str:
    """Fails with details that are not JSON (a datetime, a set)."""
    raise ToolFailed("stale", since=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), tags={"a"})


@tool
async def unencodable() -> ToolResult:
    """Returns a result the reply cannot serialize (a backend bug the caller must survive)."""
    structured: dict[str, Any] = {"x": object()}
    return ToolResult.model_construct(text="", structured=structured, content=None)


@dataclass
class Rig:
    pipeline: Pipeline
    sent: ListPublisher
    probe: Probe
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    async def request(
        self,
        tool: str | None,
        body: dict[str, Any] | bytes,
        *,
        response_topic: str | None = REPLY,
        correlation: bytes | None = CORRELATION,
        **inbound: Any,
    ) -> None:
        topic = f"tb/call/{tool}" if tool else "tb/call"
        payload = json.dumps(body).encode() if isinstance(body, dict) else body
        await self.pipeline.handle(
            Inbound(
                topic=topic,
                payload=payload,
                response_topic=response_topic,
                correlation_data=correlation if response_topic else None,
                **inbound,
            )
        )

    async def call(self, tool: str | None, body: dict[str, Any] | bytes) -> dict[str, Any]:
        """One v5 request; its one reply, parsed."""
        await self.request(tool, body)
        return self.reply()

    def reply(self, topic: str = REPLY) -> dict[str, Any]:
        replies = self.sent.on(topic)
        assert len(replies) == 1, self.sent.sent
        self.sent.sent.clear()
        return dict(json.loads(replies[0].payload))

    def dead(self) -> list[dict[str, Any]]:
        return [json.loads(out.payload) for out in self.sent.on("tb/dead")]

    def counted(self, name: str, **attributes: str) -> float:
        return sum(
            point.value
            for point in metric_points(self.metrics, name)
            if isinstance(point, NumberDataPoint)
            and all((point.attributes or {}).get(k) == v for k, v in attributes.items())
        )


class FailingPublisher(ListPublisher):
    """Raises on the first publish to `topic` (a bug the last-resort path must survive);
    keeps everything else."""

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic, self.failed = topic, False

    async def publish(self, out: Outbound) -> None:
        if out.topic == self.topic and not self.failed:
            self.failed = True
            raise RuntimeError("publisher bug")
        await super().publish(out)


class GivingUpPublisher(ListPublisher):
    """Keeps everything, and reports what it sends to `topics` as given up on: the
    broker did not acknowledge it in time."""

    def __init__(self, *topics: str) -> None:
        super().__init__()
        self.topics = topics

    async def publish(self, out: Outbound) -> Unconfirmed | None:
        await super().publish(out)
        return Unconfirmed(out) if out.topic in self.topics else None


def rig_for(
    local_tools: list[LocalTool],
    probe: Probe,
    publisher: ListPublisher | None = None,
    store: DedupStore | None = None,
    slots: Slots | None = None,
    tracer: trace.Tracer | None = None,
    tokens: TokenStore | None = None,
    **overrides: Any,
) -> Rig:
    """A pipeline over these tools; its spans recorded in memory unless `tracer` (the
    API's no-op, one that samples nothing) says otherwise."""
    settings = Settings.model_validate(
        {"topic_prefix": "tb", "max_payload_bytes": 4096, **overrides}
    )
    spans, collector = InMemorySpanExporter(), TraceCollector()
    provider = TracerProvider()
    provider.add_span_processor(collector)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer or provider.get_tracer("test")
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"))
    registry = build_registry([*BUILTIN_TOOLS, *local_tools], settings)
    executor = build_executor(settings, registry, tracer=tracer, metrics=metrics)
    sent = publisher or ListPublisher()
    once = (
        None
        if store is None
        else Once(store, 60.0, executor.idempotent, max_reply_bytes=settings.dedup_max_reply_bytes)
    )
    pipeline = Pipeline(
        executor,
        topics_for(settings),
        sent,
        worker_id="w1",
        max_payload_bytes=settings.max_payload_bytes,
        dead_letter_max_bytes=settings.dead_letter_max_bytes,
        tracer=tracer,
        collector=collector,
        metrics=metrics,
        once=once,
        quotas=Quotas(settings.callers),
        slots=slots,
        max_calls=settings.max_calls_per_message,
        progress_rate_per_s=settings.progress_rate_per_s,
        token_store=tokens,
    )
    return Rig(pipeline, sent, probe, spans, reader)


def anonymous_key(ident: str) -> str:
    """The store key of `ident` from the anonymous client answered on `REPLY`."""
    key = Once.key(None, REPLY, ident)
    assert key is not None
    return key


def standard_rig(publisher: ListPublisher | None = None, store: DedupStore | None = None) -> Rig:
    probe = Probe()
    return rig_for(
        [*probe_tools(probe), when_failed, unencodable, quits],
        probe,
        publisher,
        store,
        callers={"kitchen": {"tools": ["echo"]}},
        tools={"sleepy": {"timeout_s": 0.1}, "echo": {"idempotent": True}},
    )


@pytest.fixture
def rig() -> Rig:
    return standard_rig()


# -- answers ---------------------------------------------------------------------------


async def test_a_v5_reply_carries_correlation_data_and_content_type(rig: Rig) -> None:
    await rig.request("echo", {"arguments": {"text": "hi"}})
    [out] = rig.sent.on(REPLY)
    assert out.correlation_data == CORRELATION
    assert out.content_type == "application/json"
    reply = json.loads(out.payload)
    assert reply["ok"] is True and reply["result"]["structured"]["text"] == "hi"
    assert reply["id_generated"] is True


async def test_a_311_reply_goes_to_reply_to_with_the_body_id(rig: Rig) -> None:
    body = {"reply_to": "tb/reply/old", "id": "abc-1", "arguments": {"text": "hi"}}
    await rig.request("echo", body, response_topic=None)
    [out] = rig.sent.on("tb/reply/old")
    assert out.correlation_data is None
    reply = json.loads(out.payload)
    assert (reply["id"], reply["id_generated"], reply["ok"]) == ("abc-1", False, True)
    assert reply["traceparent"].startswith("00-")  # a 3.1.1 caller cannot read properties


async def test_a_311_callers_trace_goes_on_through_a_refusal(rig: Rig) -> None:
    trace_id = "ab" * 16
    body = {
        "reply_to": "tb/reply/old",
        "traceparent": f"00-{trace_id}-{'cd' * 8}-01",
        "tracestate": "vendor=x",
        "text": "hi",  # not under `arguments`: refused before it is a call
    }
    await rig.request("echo", body, response_topic=None)
    [out] = rig.sent.on("tb/reply/old")
    reply = json.loads(out.payload)
    assert reply["error"]["code"] == "bad_request"
    assert reply["trace_id"] == trace_id
    assert (reply["traceparent"].split("-")[1], reply["tracestate"]) == (trace_id, "vendor=x")


# -- every error code ----------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        b"{not json",
        b"[1, 2]",
        b'{"arguments": {}}',
        b"\xff\xfe",
        b"{" + b" " * 5000 + b"}",
        # Valid JSON that Python reads as infinity: it reached tools, whose replies then
        # were not JSON (issue 24).
        b'{"tool": "echo", "arguments": {"text": 1e999999}}',
        b'{"tool": "busy", "arguments": {"n": -1e400}}',
    ],
    ids=["not-json", "not-object", "no-tool", "not-utf8", "oversized", "infinity", "-infinity"],
)
async def test_bad_request(rig: Rig, payload: bytes) -> None:
    reply = await rig.call(None, payload)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request"


async def test_unknown_tool_with_candidates(rig: Rig) -> None:
    reply = await rig.call("ech", {})
    assert reply["error"]["code"] == "unknown_tool"
    assert "echo" in reply["error"]["details"]["candidates"]


async def test_invalid_arguments_and_local_tools_are_never_renamed(rig: Rig) -> None:
    reply = await rig.call("local_device", {"arguments": {"device_name": "X"}})
    assert reply["error"]["code"] == "invalid_arguments"
    assert reply["normalized"] == []
    assert (await rig.call("local_device", {"arguments": {"deviceName": "X"}}))["ok"]


async def test_a_number_for_a_string_parameter_is_sent_as_its_text(rig: Rig) -> None:
    reply = await rig.call("echo", {"arguments": {"text": 1234}})
    assert reply["ok"] is True and reply["result"]["structured"]["text"] == "1234"
    assert reply["normalized"] == [
        {"path": "arguments.text", "from": "integer", "to": "string", "rule": "number_to_string"}
    ]


async def test_invalid_arguments_name_the_parameters_the_tool_takes(rig: Rig) -> None:
    reply = await rig.call("echo", {"arguments": {"txt": "hi"}})
    assert reply["error"]["code"] == "invalid_arguments"
    assert reply["error"]["details"]["errors"]  # as before
    assert reply["error"]["details"]["parameters"] == [
        {"name": "text", "type": "string", "required": True},
        {"name": "data", "type": "any", "required": False},
    ]


async def test_forbidden_for_a_caller_profile(rig: Rig) -> None:
    assert (await rig.call("kitchen/echo", {"arguments": {"text": "x"}}))["ok"]
    reply = await rig.call("kitchen/busy", {"arguments": {"n": 1}})
    assert reply["error"]["code"] == "forbidden"
    assert rig.probe.calls == 0


async def test_forbidden_reply_topic_is_dead_lettered_and_not_executed(rig: Rig) -> None:
    await rig.request("busy", {"arguments": {"n": 1}}, response_topic="tb-victim/lights/set")
    assert [letter["error"]["code"] for letter in rig.dead()] == ["forbidden"]
    assert rig.probe.calls == 0
    assert all(out.topic == "tb/dead" for out in rig.sent.sent)


async def test_timeout_cancels_the_tool(rig: Rig) -> None:
    configured = await rig.call("sleepy", {})
    assert configured["error"]["code"] == "timeout"
    assert configured["error"]["details"]["timeout_s"] == 0.1
    assert rig.probe.cancelled == 1
    # The request's own deadline beats the tool's.
    requested = await rig.call("sleepy", {"timeout_s": 0.05})
    assert requested["error"]["details"]["timeout_s"] == 0.05
    assert rig.probe.cancelled == 2


async def test_cancelled_while_running_and_before_it_started(rig: Rig) -> None:
    """The running-call map finds a call by its dedup key: cancelled while its tool runs,
    the tool is cancelled and the one reply says it had started; cancelled before, the
    tool never starts, and a copy of the request replays that answer, never runs it."""
    key = Once.key(None, REPLY, "c-1")
    assert key is not None
    running = asyncio.create_task(rig.request("sleepy", {"id": "c-1", "arguments": {}}))
    async with asyncio.timeout(5):
        while rig.probe.calls == 0:
            await asyncio.sleep(0.001)  # polled, bounded: the tool has started
    assert len(rig.pipeline.running) == 1
    assert rig.pipeline.running.cancel(key, "caller") == 1
    await asyncio.wait_for(running, 5)
    reply = rig.reply()
    assert reply["error"]["code"] == "cancelled"
    assert reply["error"]["details"] == {"started": True, "in_doubt": False, "cause": "caller"}
    assert rig.probe.cancelled == 1 and len(rig.pipeline.running) == 0
    assert rig.pipeline.running.cancel(key, "caller") == 0  # finished: nothing to cancel


async def test_cancelled_before_its_tool_starts_is_never_run() -> None:
    rig = standard_rig(store=MemoryStore("w1"))
    key = Once.key(None, REPLY, "c-2")
    assert key is not None
    # Cancelled while the claim runs: the executor then refuses to start it.
    claim = rig.pipeline.running.get
    original = Once.begin

    async def begin(once: Once, *args: Any, **kwargs: Any) -> Any:
        [home] = claim(key)
        home.cancel("caller")
        return await original(once, *args, **kwargs)

    with patch.object(Once, "begin", begin):
        await rig.request("sleepy", {"id": "c-2", "arguments": {}})
    reply = rig.reply()
    assert reply["error"]["code"] == "cancelled"
    assert reply["error"]["details"]["started"] is False
    # A copy of it (a redelivery, the caller's retry) replays "not run": it stays true.
    await rig.request("sleepy", {"id": "c-2", "arguments": {}})
    again = rig.reply()
    assert again["error"]["code"] == "cancelled" and again["replayed"] is True
    assert rig.probe.calls == 0


# -- deadlines that travel -------------------------------------------------------------


async def test_a_request_past_its_v5_expiry_is_not_run(rig: Rig) -> None:
    # Held somewhere for 5 s after the broker handed it over with 2 s left.
    stale = time.monotonic() - 5
    await rig.request("busy", {"arguments": {"n": 1}}, expiry_s=2, received_at=stale)
    [out] = rig.sent.on(REPLY)
    reply = json.loads(out.payload)
    assert reply["error"]["code"] == "timeout" and reply["error"]["details"]["expired"] is True
    assert rig.probe.calls == 0
    assert out.expiry_s == 1  # its sender is gone: the broker need not keep it


async def test_a_311_deadline_in_the_past_is_not_run(rig: Rig) -> None:
    past = int(time.time() * 1000) - 1
    body = {"reply_to": "tb/reply/old", "id": "d-1", "arguments": {"n": 1}, "deadline_ms": past}
    await rig.request("busy", body, response_topic=None)
    reply = rig.reply("tb/reply/old")
    assert (reply["id"], reply["error"]["code"]) == ("d-1", "timeout")
    assert reply["error"]["details"]["expired"] is True
    assert rig.probe.calls == 0


async def test_the_senders_deadline_caps_the_calls(rig: Rig) -> None:
    # The tool allows 0.1 s, the request asks 5 s; the message expires in 1 s: the
    # request's 5 s is cut to what remains of the second.
    started = time.monotonic()
    await rig.request("sleepy", {"timeout_s": 5}, expiry_s=1, received_at=started - 0.7)
    reply = rig.reply()
    assert reply["error"]["code"] == "timeout" and "expired" not in reply["error"]["details"]
    assert 0.2 <= reply["error"]["details"]["timeout_s"] <= 0.3
    assert rig.probe.cancelled == 1
    body = {"timeout_s": 5, "deadline_ms": int(time.time() * 1000) + 200}
    capped = await rig.call("sleepy", body)
    assert 0.1 <= capped["error"]["details"]["timeout_s"] <= 0.2


async def test_a_reply_lives_as_long_as_its_sender_waits(rig: Rig) -> None:
    await rig.request("echo", {"arguments": {"text": "x"}}, expiry_s=30)
    [out] = rig.sent.on(REPLY)
    assert out.expiry_s is not None and 29 <= out.expiry_s <= 30
    rig.sent.sent.clear()
    await rig.request("echo", {"arguments": {"text": "x"}})
    [plain] = rig.sent.on(REPLY)
    assert plain.expiry_s is None  # no deadline given: the reply does not expire


@pytest.mark.parametrize("deadline_ms", [-1, 2**60, "soon", 1.5])
async def test_a_deadline_that_is_no_instant_is_a_bad_request(rig: Rig, deadline_ms: Any) -> None:
    reply = await rig.call("echo", {"deadline_ms": deadline_ms})
    assert reply["error"]["code"] == "bad_request"


async def test_unavailable_when_cancelled_while_stopping(rig: Rig) -> None:
    handling = asyncio.create_task(rig.request("gate", {"id": "late"}), name="late-call")
    await rig.probe.wait_active(1)
    rig.pipeline.stopping()
    handling.cancel()
    async with asyncio.timeout(5):
        await handling  # answers instead of ending cancelled
    reply = rig.reply()
    assert reply["id"] == "late" and reply["error"]["code"] == "unavailable"


async def test_cancelled_while_not_stopping_stays_cancelled(rig: Rig) -> None:
    handling = asyncio.create_task(rig.request("gate", {}), name="cancelled-call")
    await rig.probe.wait_active(1)
    handling.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await handling
    assert rig.sent.on(REPLY) == []


async def test_tool_error(rig: Rig) -> None:
    reply = await rig.call("explode", {"arguments": {"reason": "boom"}})
    assert reply["error"]["code"] == "tool_error"
    assert reply["error"]["details"]["exception"] == "ValueError"


@pytest.mark.parametrize(
    ("how", "exception"), [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")]
)
async def test_a_tool_that_exits_gets_tool_error(rig: Rig, how: str, exception: str) -> None:
    reply = await rig.call("quits", {"arguments": {"how": how}})
    assert reply["error"]["code"] == "tool_error"
    assert reply["error"]["details"]["exception"] == exception
    assert (await rig.call("echo", {"arguments": {"text": "after"}}))["ok"]


async def test_tool_error_details_that_are_not_json_still_reach_the_caller(rig: Rig) -> None:
    reply = await rig.call("when_failed", {})
    assert reply["error"]["code"] == "tool_error"
    assert reply["error"]["details"] == {"since": "2026-01-02T03:04:05Z", "tags": ["a"]}


async def test_internal_when_the_reply_cannot_be_encoded(rig: Rig) -> None:
    reply = await rig.call("unencodable", {"id": "u-1"})
    assert reply["id"] == "u-1" and reply["error"]["code"] == "internal"
    assert rig.counted("toolbus.internal_errors", stage="encode") == 1
    # Answered through the usual reply path: in the call's trace, its span marked.
    [process] = [s for s in rig.spans.get_finished_spans() if s.name.startswith("process ")]
    assert format(process.context.trace_id, "032x") == reply["trace_id"]
    assert (process.attributes or {})["error.type"] == "internal"


async def test_internal_dead_letter_when_dead_lettering_fails_once() -> None:
    rig = standard_rig(FailingPublisher("tb/dead"))
    await rig.request(None, b"not json", response_topic=None)
    assert [letter["error"]["code"] for letter in rig.dead()] == ["internal"]
    assert rig.counted("toolbus.internal_errors", stage="handle") == 1


SECRET = "hunter2-S3CRET"


@pytest.mark.parametrize("steps", [False, True])
async def test_a_refusal_marks_its_spans_with_the_code_and_no_value_or_stack(steps: bool) -> None:
    """`invalid_arguments` (and every answered error): the code and a message without
    the call's values on every span that saw it, no exception event (no stack), and so
    nothing of either in the trace the caller asked for."""
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, trace_steps=steps)
    body = {"arguments": {"text": {"token": SECRET}}, "publish_trace": True}
    await rig.request("echo", body)
    assert [out.topic for out in rig.sent.sent] == [REPLY, f"{REPLY}/trace"]
    assert json.loads(rig.sent.sent[0].payload)["error"]["code"] == "invalid_arguments"
    published = rig.sent.sent[1].payload.decode()
    assert SECRET not in published and "exception" not in published
    finished = {span.name: span for span in rig.spans.get_finished_spans()}
    assert ("validate" in finished) is steps
    for name in ("execute_tool echo", *(("validate",) if steps else ())):
        span = finished[name]
        assert (span.attributes or {})["error.type"] == "invalid_arguments"
        assert span.status.description == InvalidArguments.summary
    for span in finished.values():
        assert [e.name for e in span.events if e.name == "exception"] == []
        assert SECRET not in (span.status.description or "")


async def test_trace_arguments_lets_the_refusals_own_message_onto_its_span() -> None:
    """Values on spans are the operator's choice (`trace_arguments`): then the refusal's
    own message, value and all, describes the span; still no stack."""
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, trace_arguments=True)
    await rig.request("echo", {"arguments": {"text": {"token": SECRET}}})
    assert rig.reply()["error"]["code"] == "invalid_arguments"
    [span] = [s for s in rig.spans.get_finished_spans() if s.name == "execute_tool echo"]
    assert SECRET in (span.status.description or "")
    assert [e.name for e in span.events] == []


@pytest.mark.parametrize(
    ("tracer", "reason"),
    [
        (trace.NoOpTracer(), "not_recording"),
        (TracerProvider(sampler=ALWAYS_OFF).get_tracer("t"), "not_sampled"),
    ],
)
async def test_a_trace_asked_for_that_cannot_come_is_said_so_in_the_reply(
    tracer: trace.Tracer, reason: str
) -> None:
    """`publish_trace` on a worker that records nothing (no exporter, `publish_traces`
    off), or whose sampler dropped the trace: the reply says why no trace follows."""
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, tracer=tracer)
    await rig.request("echo", {"arguments": {"text": "x"}, "publish_trace": True})
    assert [out.topic for out in rig.sent.sent] == [REPLY]  # nothing on {REPLY}/trace
    assert rig.reply()["trace_unavailable"] == reason
    body = {"arguments": {"text": "x"}, "publish_trace": True, "reply_format": "openai"}
    await rig.request("echo", body)
    assert rig.reply()["trace_unavailable"] == reason  # one reply for many calls too
    await rig.request("echo", {"arguments": {"text": "x"}})
    assert rig.reply().get("trace_unavailable") is None  # not asked, nothing to say
    recorded = standard_rig()
    await recorded.request("echo", {"arguments": {"text": "x"}, "publish_trace": True})
    assert [out.topic for out in recorded.sent.sent] == [REPLY, f"{REPLY}/trace"]
    assert json.loads(recorded.sent.sent[0].payload).get("trace_unavailable") is None


async def test_a_failed_trace_publish_leaves_the_answer_alone() -> None:
    rig = standard_rig(FailingPublisher(f"{REPLY}/trace"))
    await rig.request("echo", {"arguments": {"text": "x"}, "publish_trace": True})
    assert rig.reply()["ok"] is True  # one reply, the real one; no `internal` after it
    assert rig.counted("toolbus.internal_errors", stage="trace") == 1
    assert rig.counted("toolbus.internal_errors", stage="handle") == 0


@pytest.mark.parametrize("traced", [False, True])
async def test_a_reply_the_broker_did_not_take_is_handed_back(traced: bool) -> None:
    """The worker leaves such a request unacknowledged (see `redeliveries`)."""
    rig = standard_rig(GivingUpPublisher(REPLY))
    body = {"arguments": {"text": "x"}, "publish_trace": traced}
    message = Inbound(
        topic="tb/call/echo",
        payload=json.dumps(body).encode(),
        response_topic=REPLY,
        correlation_data=CORRELATION,
    )
    unconfirmed = await rig.pipeline.handle(message)
    assert unconfirmed is not None
    assert unconfirmed.out == rig.sent.on(REPLY)[0]


async def test_a_dead_letter_or_a_trace_given_up_on_is_not_handed_back() -> None:
    """Nobody waits for those: their requests are acknowledged all the same."""
    rig = standard_rig(GivingUpPublisher("tb/dead", f"{REPLY}/trace"))
    dead = Inbound(topic="tb/call", payload=b"not json")
    assert await rig.pipeline.handle(dead) is None
    assert len(rig.dead()) == 1
    body = {"arguments": {"text": "x"}, "publish_trace": True}
    traced = Inbound(
        topic="tb/call/echo",
        payload=json.dumps(body).encode(),
        response_topic=REPLY,
        correlation_data=CORRELATION,
    )
    assert await rig.pipeline.handle(traced) is None
    assert rig.sent.on(f"{REPLY}/trace")  # the trace was given up on


# -- one run per request id --------------------------------------------------------------


@pytest.fixture
def deduped() -> Rig:
    return standard_rig(store=MemoryStore("w1"))


async def test_a_repeat_of_an_answered_request_is_replayed(deduped: Rig) -> None:
    first = await deduped.call("busy", {"id": "r1", "arguments": {"n": 1}})
    again = await deduped.call("busy", {"id": "r1", "arguments": {"n": 1}})
    assert deduped.probe.calls == 1
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert again["result"] == first["result"] and again["id"] == "r1"


class WatchedStore(MemoryStore):
    """The in-process store, saying when someone starts waiting on it."""

    def __init__(self) -> None:
        super().__init__("w1")
        self.waiting = asyncio.Event()

    async def wait(self, key: str, timeout_s: float, *, fingerprint: str = "") -> bytes | None:
        self.waiting.set()
        return await super().wait(key, timeout_s, fingerprint=fingerprint)


async def test_a_repeat_while_running_gets_the_same_reply() -> None:
    store = WatchedStore()
    deduped = standard_rig(store=store)
    first = asyncio.create_task(deduped.request("gate", {"id": "g1"}), name="first")
    await deduped.probe.wait_active(1)
    repeat = asyncio.create_task(deduped.request("gate", {"id": "g1"}), name="repeat")
    async with asyncio.timeout(5):
        await store.waiting.wait()  # the repeat found the run going and waits for it
    deduped.probe.release.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, repeat)
    replies = [json.loads(out.payload) for out in deduped.sent.on(REPLY)]
    assert sorted(r["replayed"] for r in replies) == [False, True]
    assert deduped.probe.calls == 1


async def test_a_call_that_never_ran_leaves_its_id_free(deduped: Rig) -> None:
    assert (await deduped.call("busy", {"id": "x1", "arguments": {}}))["error"]["code"] == (
        "invalid_arguments"
    )
    second = await deduped.call("busy", {"id": "x1", "arguments": {"n": 2}})
    assert second["ok"] and second["replayed"] is False


async def test_generated_ids_are_never_deduplicated(deduped: Rig) -> None:
    for _ in range(2):
        assert (await deduped.call("busy", {"arguments": {"n": 1}}))["replayed"] is False
    assert deduped.probe.calls == 2


async def test_in_doubt_when_the_first_run_was_cut_short(redis_server: RedisServer) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    dead = RedisStore(redis_server.url, "w-dead", prefix=prefix)
    async with dead:
        for ident in ("d1", "d2"):
            await dead.claim(anonymous_key(ident), 60.0)
    # w-dead has stopped with both runs open; w2 gets the repeats.
    rig = standard_rig(store=RedisStore(redis_server.url, "w2", prefix=prefix))
    async with rig.pipeline:
        doubt = await rig.call("busy", {"id": "d1", "arguments": {"n": 1}})
        rerun = await rig.call("echo", {"id": "d2", "arguments": {"text": "x"}})
    assert doubt["error"]["code"] == "in_doubt"
    assert doubt["error"]["details"]["worker_id"] == "w-dead"
    assert rig.probe.calls == 0  # not run again: it may have taken effect
    assert rerun["ok"]  # echo is configured idempotent: safe to run again


async def test_reply_not_kept_for_a_repeat_of_a_reply_over_the_bound() -> None:
    """A reply over `dedup_max_reply_bytes` is kept as its summary: the repeat learns the
    call ran and how it ended, never gets the call run again, and never the whole reply
    held for `dedup_ttl_s` (issue 29: 300 results of 1.9 MB held 580 MiB)."""
    runs: list[int] = []

    @tool
    async def report(size: int) -> str:
        """A long report."""
        runs.append(size)
        return "r" * size

    probe = Probe()
    rig = rig_for(
        [report], probe, store=MemoryStore("w1"), dedup_max_reply_bytes=2048, max_payload_bytes=8192
    )
    async with rig.pipeline:
        first = await rig.call("report", {"id": "big", "arguments": {"size": 4000}})
        again = await rig.call("report", {"id": "big", "arguments": {"size": 4000}})
        small = await rig.call("report", {"id": "small", "arguments": {"size": 10}})
        small_again = await rig.call("report", {"id": "small", "arguments": {"size": 10}})
    assert first["ok"] and len(first["result"]["text"]) == 4000
    assert again["error"]["code"] == "reply_not_kept" and again["replayed"] is True
    details = again["error"]["details"]
    assert details["ok"] is True and details["reply_bytes"] > 4000
    assert (again["id"], again["tool"]) == ("big", "report")
    assert small_again["replayed"] and small_again["result"] == small["result"]
    assert runs == [4000, 10]  # each ran once


async def test_a_reply_survives_a_stalled_redis_and_is_written_once_it_is_back(
    own_redis: RedisServer,
) -> None:
    """Redis frozen (SIGSTOP) while a call runs: the reply still leaves, a repeat here is
    answered from what this worker kept, and once Redis is back the reply is written, so
    no worker later reports the finished call running or in doubt (15 finished calls
    stayed `started` after a 20 s stall: `timeout` for 600 s, or `in_doubt`)."""
    assert own_redis.process is not None
    prefix = f"t{uuid.uuid4().hex[:8]}"
    store = KeptReplies(
        RedisStore(own_redis.url, "w1", prefix=prefix, timeout_s=0.5), write_timeout_s=1.0
    )
    rig = standard_rig(store=store)
    async with rig.pipeline, RedisStore(own_redis.url, "w2", prefix=prefix) as other:
        first = asyncio.create_task(rig.request("gate", {"id": "s1"}), name="first")
        await rig.probe.wait_active(1)
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            rig.probe.release.set()
            began = time.monotonic()
            async with asyncio.timeout(30):  # one bounded write, then the reply leaves
                await first
            measured(f"reply with Redis frozen (1 s write bound): {time.monotonic() - began:.2f} s")
            answered = rig.reply()
            assert answered["ok"] and answered["replayed"] is False
            assert store.kept() == 1
            again = await rig.call("gate", {"id": "s1"})  # the store still frozen
            assert again["ok"] and again["replayed"] is True
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        async with asyncio.timeout(30):
            await store.all_written()
        seen = await other.claim(anonymous_key("s1"), 60.0)
        assert seen.kind == "done" and seen.reply is not None
        assert json.loads(seen.reply)["ok"] is True
    assert rig.probe.calls == 1
    # The worker gone, a new incarnation of w1 finds the call answered, not cut short.
    async with RedisStore(own_redis.url, "w1", prefix=prefix) as restarted:
        assert (await restarted.claim(anonymous_key("s1"), 60.0)).kind == "done"


async def test_another_callers_flood_of_ids_does_not_forget_a_callers_call() -> None:
    """The memory store's bound is shared fairly: 1 000 ids from garage past a bound of
    100 forget garage's own oldest calls, never kitchen's booking (it used to run again)."""
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, store=MemoryStore("w1", max_records=100))
    booking = {"id": "book-1", "caller": "kitchen", "arguments": {"n": 1, "hold_ms": 0}}
    assert (await rig.call("busy", booking))["ok"]
    for n in range(1000):
        flood = {"id": f"f{n}", "caller": "garage", "arguments": {"text": "x"}}
        assert (await rig.call("echo", flood))["ok"]
    again = await rig.call("busy", booking)
    assert again["ok"] and again["replayed"] is True
    assert probe.calls == 1
    first = await rig.call("echo", {"id": "f0", "caller": "garage", "arguments": {"text": "x"}})
    assert first["replayed"] is False  # garage's oldest went: its own share, no more


async def test_rate_limited_beyond_the_caller_quota_and_only_that_caller() -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, callers={"kitchen": {"rate_per_s": 0.01, "burst": 2}})
    for _ in range(2):
        assert (await rig.call("echo", {"caller": "kitchen", "arguments": {"text": "x"}}))["ok"]
    limited = await rig.call("echo", {"caller": "kitchen", "arguments": {"text": "x"}})
    assert limited["error"]["code"] == "rate_limited"
    assert limited["error"]["details"]["limit"] == "rate"
    assert 1000 < limited["error"]["details"]["retry_after_ms"] <= 30_000
    assert (await rig.call("echo", {"caller": "garage", "arguments": {"text": "x"}}))["ok"]
    assert rig.counted("toolbus.rate_limited", limit="rate") == 1


async def test_rate_limited_beyond_max_in_flight_without_waiting() -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, callers={"*": {"max_in_flight": 2}})
    held = [
        asyncio.create_task(
            rig.request("gate", {"caller": "kitchen"}, response_topic=f"tb/reply/{n}")
        )
        for n in range(2)
    ]
    await probe.wait_active(2)
    async with asyncio.timeout(1):  # refused at once: it never waits for a slot
        limited = await rig.call("gate", {"caller": "kitchen"})
    assert limited["error"]["code"] == "rate_limited"
    assert limited["error"]["details"]["limit"] == "in_flight"
    assert probe.calls == 2
    probe.release.set()
    await asyncio.gather(*held)
    assert (await rig.call("gate", {"caller": "kitchen"}))["ok"]  # its place came back


# Every wire code has a case above; a new code fails here until it has one too.
async def test_unknown_task_from_a_worker_that_keeps_no_tasks(rig: Rig) -> None:
    """tasks/get is answered on the asker's reply topic (the cases with task records:
    tests/calls/test_tasks.py)."""
    await rig.pipeline.handle(
        Inbound(
            topic="tb/tasks/get",
            payload=json.dumps({"task_id": "nope", "id": "q1"}).encode(),
            response_topic=REPLY,
            correlation_data=CORRELATION,
        )
    )
    answer = rig.reply()
    assert answer["id"] == "q1" and answer["ok"] is False
    assert answer["error"]["code"] == "unknown_task"


def approving_rig() -> Rig:
    """Caller `ops` must have `busy` approved; the dedup store is this worker's memory."""
    probe = Probe()
    return rig_for(
        probe_tools(probe), probe, store=MemoryStore("w1"), callers={"ops": {"approve": ["busy"]}}
    )


async def test_approval_required_runs_nothing_and_the_approved_call_runs_once() -> None:
    rig = approving_rig()
    gated = await rig.call("ops/busy", {"id": "a-1", "arguments": {"n": "7"}})
    assert gated["error"]["code"] == "approval_required"
    details = gated["error"]["details"]
    # The call as it would run: canonical name, normalized arguments ("7" is 7, a default).
    assert details["call"] == {"tool": "busy", "arguments": {"n": 7, "hold_ms": 5.0}}
    assert (details["reason"], details["expires_in_s"]) == ("tool", 300.0)
    assert rig.probe.calls == 0
    # The same request id, approved: it runs (the gated request left its id free), once.
    approved = {"id": "a-1", "arguments": {"n": 7}, "approval": details["approval"]}
    assert (await rig.call("ops/busy", approved))["ok"]
    assert rig.probe.calls == 1
    again = await rig.call("ops/busy", approved)  # a redelivery: replayed, not run
    assert (again["ok"], again.get("replayed")) == (True, True)
    assert rig.probe.calls == 1


async def test_approval_invalid_when_used_again_or_altered() -> None:
    rig = approving_rig()
    gated = await rig.call("ops/busy", {"id": "b-1", "arguments": {"n": 1}})
    token = gated["error"]["details"]["approval"]
    altered = await rig.call("ops/busy", {"id": "b-2", "arguments": {"n": 2}, "approval": token})
    assert altered["error"]["code"] == "approval_invalid"
    assert altered["error"]["details"]["reason"] == "mismatch"
    assert (await rig.call("ops/busy", {"id": "b-3", "arguments": {"n": 1}, "approval": token}))[
        "ok"
    ]
    used = await rig.call("ops/busy", {"id": "b-4", "arguments": {"n": 1}, "approval": token})
    assert (used["error"]["code"], used["error"]["details"]["reason"]) == (
        "approval_invalid",
        "used",
    )
    other = await rig.call("eve/busy", {"id": "b-5", "arguments": {"n": 1}, "approval": token})
    assert other["ok"]  # eve is not gated: an approval is not looked at
    assert rig.probe.calls == 2


CODES_WITH_A_CASE = {
    "bad_request": test_bad_request,
    "unknown_tool": test_unknown_tool_with_candidates,
    "invalid_arguments": test_invalid_arguments_and_local_tools_are_never_renamed,
    "forbidden": test_forbidden_for_a_caller_profile,
    "timeout": test_timeout_cancels_the_tool,
    "unavailable": test_unavailable_when_cancelled_while_stopping,
    "tool_error": test_tool_error,
    "internal": test_internal_when_the_reply_cannot_be_encoded,
    "in_doubt": test_in_doubt_when_the_first_run_was_cut_short,
    "rate_limited": test_rate_limited_beyond_the_caller_quota_and_only_that_caller,
    "reply_not_kept": test_reply_not_kept_for_a_repeat_of_a_reply_over_the_bound,
    "cancelled": test_cancelled_while_running_and_before_it_started,
    "unknown_task": test_unknown_task_from_a_worker_that_keeps_no_tasks,
    "input_required": rounds.test_a_question_is_answered_with_a_continuation_and_the_call_goes_on,
    "continuation_invalid": rounds.test_a_token_is_single_use_and_a_copy_of_its_request_replays,
    "approval_required": test_approval_required_runs_nothing_and_the_approved_call_runs_once,
    "approval_invalid": test_approval_invalid_when_used_again_or_altered,
}


def test_every_error_code_has_a_case() -> None:
    assert set(CODES_WITH_A_CASE) == {code.value for code in ErrorCode}


# -- dead letters ----------------------------------------------------------------------


async def test_dead_letters_keep_the_payload_and_topic(rig: Rig) -> None:
    await rig.request(None, b"not json at all", response_topic=None)
    await rig.request("no_such_tool", {}, response_topic=None)
    letters = rig.dead()
    assert [letter["error"]["code"] for letter in letters] == ["bad_request", "unknown_tool"]
    assert letters[0]["payload"] == "not json at all"
    assert letters[0]["topic"] == "tb/call"
    assert rig.counted("toolbus.dead_letters", code="unknown_tool") == 1


def bounded_rig(**overrides: Any) -> Rig:
    probe = Probe()
    return rig_for(probe_tools(probe), probe, max_payload_bytes=16_384, **overrides)


async def test_dead_letters_keep_at_most_4_kib_by_default() -> None:
    rig = bounded_rig()
    payload = b"not json: " + b"x" * 5000 + b" SECRET-TAIL"
    await rig.request(None, payload, response_topic=None)
    [letter] = rig.dead()
    assert letter["payload"] == payload[:4096].decode()
    assert (letter["payload_bytes"], letter["truncated"]) == (len(payload), True)
    assert b"SECRET-TAIL" not in rig.sent.sent[0].payload


async def test_a_character_cut_by_the_bound_is_left_out_not_base64() -> None:
    rig = bounded_rig(dead_letter_max_bytes=100)
    payload = b"x" * 99 + "é".encode() * 10  # byte 100 is the first half of an é
    await rig.request(None, payload, response_topic=None)
    [letter] = rig.dead()
    assert (letter["encoding"], letter["payload"]) == ("utf-8", "x" * 99)
    assert (letter["payload_bytes"], letter["truncated"]) == (119, True)


@pytest.mark.parametrize(
    "payload",
    [b"\xff\xfe binary" + b"y" * 200, b"ends mid-character \xc3"],
    ids=["binary-and-cut", "whole-but-incomplete"],
)
async def test_invalid_utf8_is_base64_of_the_kept_bytes(payload: bytes) -> None:
    rig = bounded_rig(dead_letter_max_bytes=100)
    await rig.request(None, payload, response_topic=None)
    [letter] = rig.dead()
    assert letter["encoding"] == "base64"
    assert base64.b64decode(letter["payload"]) == payload[:100]
    assert (letter["payload_bytes"], letter["truncated"]) == (len(payload), len(payload) > 100)


async def test_dead_letter_max_bytes_0_keeps_no_payload() -> None:
    rig = bounded_rig(dead_letter_max_bytes=0)
    await rig.request("no_such_tool", {"arguments": {"secret": "s3cr3t"}}, response_topic=None)
    [letter] = rig.dead()
    assert letter["error"]["code"] == "unknown_tool"
    assert (letter["payload"], letter["truncated"]) == ("", True)
    assert letter["payload_bytes"] == len(b'{"arguments": {"secret": "s3cr3t"}}')


async def test_a_success_without_reply_address_publishes_nothing(rig: Rig) -> None:
    await rig.request("echo", {"arguments": {"text": "x"}}, response_topic=None)
    assert rig.sent.sent == []


# -- traces ------------------------------------------------------------------------------


async def test_trace_published_after_the_reply_when_asked(rig: Rig) -> None:
    await rig.request("echo", {"arguments": {"text": "x"}, "publish_trace": True})
    assert [out.topic for out in rig.sent.sent] == [REPLY, f"{REPLY}/trace"]
    reply, trace_message = (json.loads(out.payload) for out in rig.sent.sent)
    assert rig.sent.sent[1].correlation_data == CORRELATION
    spans = [
        span
        for resource in trace_message["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    assert {span["traceId"] for span in spans} == {reply["trace_id"]}
    assert "execute_tool echo" in {span["name"] for span in spans}


async def test_no_trace_unless_asked(rig: Rig) -> None:
    await rig.request("echo", {"arguments": {"text": "x"}})
    assert [out.topic for out in rig.sent.sent] == [REPLY]


@pytest.mark.parametrize("steps", [False, True])
async def test_a_call_has_three_spans_and_its_steps_only_with_trace_steps(steps: bool) -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, trace_steps=steps)
    reply = await rig.call("echo", {"arguments": {"text": "x"}})
    spans = rig.spans.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in spans if s.context} == {reply["trace_id"]}
    named = {"process tb/call/echo", "execute_tool echo", f"send {REPLY}"}
    assert sorted(s.name for s in spans) == sorted(
        named | ({"normalize", "validate"} if steps else set())
    )


async def test_a_failed_call_marks_its_spans(rig: Rig) -> None:
    reply = await rig.call("explode", {})
    found = [s for s in rig.spans.get_finished_spans() if s.name == "process tb/call/explode"]
    assert found and found[0].attributes is not None
    assert found[0].attributes["error.type"] == "tool_error"
    assert format(found[0].context.trace_id, "032x") == reply["trace_id"]


def test_a_reply_expiry_is_capped_at_what_mqtt_can_carry() -> None:
    """A `deadline_ms` centuries away still makes a reply the transport can encode."""
    far = ReplyAddress("tb/reply/r1", b"c", expires_at=time.monotonic() + 2**40)
    out = outbound_reply(far, Reply(id="a", ok=True, duration_ms=0.0))
    assert out.expiry_s == 0xFFFFFFFF
    publish_properties(out)  # encodes: four bytes


async def test_a_numeric_string_past_pythons_int_limit_is_invalid_arguments() -> None:
    """A 5 000-digit string for an integer parameter: Python will not make an int of more
    than 4 300 digits, and the ValueError answered `internal`. Left as text, the schema
    says what is wrong (issue 24)."""
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, max_payload_bytes=100_000)
    async with rig.pipeline:
        reply = await rig.call("busy", {"arguments": {"n": "9" * 5000}})
        assert reply["error"]["code"] == "invalid_arguments", reply["error"]
        assert (await rig.call("busy", {"arguments": {"n": "12"}}))["result"]["structured"] == {
            "n": 12
        }
    assert probe.calls == 1


async def test_a_request_delivered_retained_is_refused(rig: Rig) -> None:
    """A broker that ignores Retain Handling still hands a retained request over with the
    retain flag: it is refused (`bad_request`, reason `retained`), never run (issue 24)."""
    await rig.request("busy", {"arguments": {"n": 1}}, retain=True)
    reply = rig.reply()
    assert reply["error"]["code"] == "bad_request"
    assert reply["error"]["details"]["reason"] == "retained"
    await rig.request("busy", {"arguments": {"n": 1}}, response_topic=None, retain=True)
    assert [letter["error"]["details"]["reason"] for letter in rig.dead()] == ["retained"]
    assert rig.probe.calls == 0
