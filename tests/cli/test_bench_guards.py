"""`toolbus bench`'s guards: each holds on what a real worker did, and fails when what it
guards is doctored away (a span missing, a reply differing, a call line missing, an
update lost, a cancel not honoured, a repeat run twice).

One real guards step (`guard_run.observe`: a private mosquitto, a guard `toolbus serve`
with the demo MCP server and the guard tools, OTLP export to the decoding sink) is made
once for the module, in a few seconds; every other test doctors a copy of what it saw,
so each check is shown to fail on exactly the evidence it exists for.
"""

from __future__ import annotations

import copy
import dataclasses
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

from toolbus.cli.bench.guard_run import Seen, judge, observe, sampled_trace_id
from toolbus.cli.bench.guards import (
    CALL_LINES_AT_INFO,
    CANCEL,
    DEDUP_REPEAT,
    DEDUP_RUNNING,
    GUARDS,
    MCP_CANCEL,
    MCP_PROGRESS,
    OTLP_CLIENT,
    PROGRESS,
    SETTLED_EQUALS_FULL,
    TRACED_MCP_CALL,
    check_trace,
)
from toolbus.cli.bench.mosquitto import private_broker
from toolbus.cli.bench.phases import MCP_TOOL
from toolbus.cli.bench.served import ServeOptions
from toolbus.cli.bench.span_sink import decode, span_sink

CLIENT = OtlpSpan.SpanKind.SPAN_KIND_CLIENT
DEMO_SERVICE = "toolbus-demo-devices"  # the demo server's spans' service.name


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    with private_broker() as broker:
        yield observe(tmp_path_factory.mktemp("guards"), broker.url, ServeOptions())


def failures(seen: Seen) -> dict[str, str]:
    return {r.name: r.detail for r in judge(seen) if not r.ok}


def doctored(real: Seen) -> Seen:
    return copy.deepcopy(real)


def test_every_guard_holds_on_the_real_worker(real: Seen) -> None:
    results = judge(real)
    assert [r.name for r in results] == list(GUARDS)
    assert all(r.ok for r in results), [r.line() for r in results]
    assert real.executions == real.running_executions == 1
    assert real.cancel_stopped and real.mcp_cancel_stopped  # each cancel reached its tool
    # Only the traced calls recorded: the rest took the unrecorded path the bench measures.
    assert {s.trace_id for s in real.spans} == set(real.trace_ids.values())
    assert real.repeat.get("replayed") is real.running_repeat.get("replayed") is True


def test_a_traced_call_without_the_workers_client_span_fails(real: Seen) -> None:
    seen = doctored(real)
    seen.spans = [s for s in seen.spans if s.kind != OTLP_CLIENT]
    assert set(failures(seen)) == {TRACED_MCP_CALL}
    assert "no CLIENT span" in failures(seen)[TRACED_MCP_CALL]


def test_a_traced_call_without_the_servers_span_fails(real: Seen) -> None:
    seen = doctored(real)
    seen.spans = [s for s in seen.spans if s.service != DEMO_SERVICE]
    assert set(failures(seen)) == {TRACED_MCP_CALL}


@pytest.mark.parametrize("path", ["settled", "full"])
def test_a_server_span_not_beneath_the_client_span_fails(real: Seen, path: str) -> None:
    """The server's span in the trace, but its parent not the worker's call (the context
    did not travel in `_meta`: the server started a trace of its own, here re-parented),
    on either path's traced call."""
    seen = doctored(real)
    trace_id = seen.trace_ids[path]
    [server] = [s for s in seen.spans if s.service == DEMO_SERVICE and s.trace_id == trace_id]
    orphan = dataclasses.replace(server, parent_span_id="ab" * 8)
    seen.spans = [orphan if s is server else s for s in seen.spans]
    assert set(failures(seen)) == {TRACED_MCP_CALL}


def test_the_spans_must_be_in_the_callers_trace(real: Seen) -> None:
    """The same spans judged for a trace id the caller did not send: none there."""
    seen = doctored(real)
    seen.trace_ids["full"] = sampled_trace_id()
    assert set(failures(seen)) == {TRACED_MCP_CALL}
    assert check_trace(real.spans, sampled_trace_id(), MCP_TOOL) is not None


def test_a_settled_reply_that_differs_from_the_full_paths_fails(real: Seen) -> None:
    seen = doctored(real)
    seen.settled["result"]["structured"]["device"]["level"] = 99
    assert set(failures(seen)) == {SETTLED_EQUALS_FULL}
    seen = doctored(real)
    seen.full["normalized"] = []  # the full path did not run: nothing compared
    assert set(failures(seen)) == {SETTLED_EQUALS_FULL}


def test_a_missing_call_line_fails(real: Seen) -> None:
    seen = doctored(real)
    lost = seen.ran[2]
    seen.log = "\n".join(line for line in seen.log.splitlines() if lost not in line)
    assert set(failures(seen)) == {CALL_LINES_AT_INFO}
    assert lost in failures(seen)[CALL_LINES_AT_INFO]


@pytest.mark.parametrize(("name", "field"), [(PROGRESS, "steps"), (MCP_PROGRESS, "mcp_steps")])
def test_a_lost_or_reordered_update_fails(real: Seen, name: str, field: str) -> None:
    seen = doctored(real)
    del getattr(seen, field)[1]
    assert set(failures(seen)) == {name}
    seen = doctored(real)
    updates = getattr(seen, field)
    updates[0], updates[1] = updates[1], updates[0]
    assert set(failures(seen)) == {name}
    seen = doctored(real)
    setattr(seen, field, getattr(seen, field)[-1:])  # no update relayed at all
    assert set(failures(seen)) == {name}


@pytest.mark.parametrize(
    ("name", "field", "stopped"),
    [(CANCEL, "cancelled", "cancel_stopped"), (MCP_CANCEL, "mcp_cancelled", "mcp_cancel_stopped")],
)
def test_a_cancel_not_honoured_fails(real: Seen, name: str, field: str, stopped: str) -> None:
    seen = doctored(real)
    setattr(seen, stopped, False)  # answered `cancelled`, but the tool ran on
    assert set(failures(seen)) == {name}
    seen = doctored(real)
    messages = getattr(seen, field)
    messages[-1] = {**messages[-1], "ok": True, "error": None}  # ran to its end
    assert set(failures(seen)) == {name}
    seen = doctored(real)
    setattr(seen, field, getattr(seen, field)[:-1])  # never answered
    assert set(failures(seen)) == {name}


@pytest.mark.parametrize(("name", "prefix"), [(DEDUP_REPEAT, ""), (DEDUP_RUNNING, "running_")])
def test_a_repeat_run_twice_fails(real: Seen, name: str, prefix: str) -> None:
    seen = doctored(real)
    setattr(seen, f"{prefix}executions", 2)
    assert set(failures(seen)) == {name}
    seen = doctored(real)
    getattr(seen, f"{prefix}repeat")["replayed"] = False
    assert set(failures(seen)) == {name}


def test_the_repeat_guards_are_left_out_where_nothing_promises_them(real: Seen) -> None:
    """Several processes on the memory store: ids are remembered per process."""
    seen = doctored(real)
    seen.executions = seen.running_executions = 2
    left_out = [r for r in judge(seen, dedup_counted=False) if r.name.startswith(DEDUP_REPEAT)]
    assert [r.name for r in left_out] == [DEDUP_REPEAT, DEDUP_RUNNING]
    assert all(r.ok and "skipped" in r.detail for r in left_out)


def test_the_sink_decodes_what_an_exporter_posts(tmp_path: Path) -> None:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    attribute = resource.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", "svc"
    span = resource.scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id, span.kind = "s", b"\x01" * 16, b"\x02" * 8, CLIENT
    body = request.SerializeToString()
    assert [(s.name, s.service, s.kind) for s in decode(body)] == [("s", "svc", 3)]
    for keep in (True, False):  # the guards' sink; a measured run's, which only counts
        with span_sink(keep=keep) as sink:
            for payload in (body, b"\xff not protobuf"):
                post = urllib.request.Request(f"{sink.endpoint}/v1/traces", payload, method="POST")
                with urllib.request.urlopen(post, timeout=10) as answer:
                    assert answer.status == 200
            assert sink.traces_received == 2
            assert [s.trace_id for s in sink.spans()] == (["01" * 16] if keep else [])
            assert sink.undecodable == (1 if keep else 0)


def test_the_sampled_trace_id_is_sampled_by_the_guards_ratio() -> None:
    """The one trace the guard worker records: its ratio sampler takes it (and would
    take a random id about once in a million)."""
    sampler = TraceIdRatioBased(1e-6)
    for _ in range(100):
        trace_id = int(sampled_trace_id(), 16)
        assert sampler.should_sample(None, trace_id, "x").decision is Decision.RECORD_AND_SAMPLE
