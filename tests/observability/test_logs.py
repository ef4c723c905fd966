"""Log lines as data: the per-call line's fields in JSON and on a terminal, the other
lines operators filter on, and what a caller's arguments can and cannot put in a log.

Lines are read as the worker writes them: through `log_handler`, the handler
`setup_logging` installs, into a buffer, then parsed.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from tests.calls.test_pipeline import Rig, rig_for, standard_rig
from tests.support.normalize_cases import mcp_tool
from tests.support.tools import Probe, probe_tools
from toolbus.backends.local import BUILTIN_TOOLS
from toolbus.calls.call import Call
from toolbus.calls.call_log import LOGGED_NAME_CHARS, LOGGED_NAMES, log_call
from toolbus.observability.logs import json_formatter, log_handler, logfmt_value
from toolbus.tools.registry import Registry

CALL_FIELDS = {"call_id", "tool", "outcome", "duration_ms", "caller", "argument_bytes"}
LINE_FIELDS = {"ts", "level", "logger", "event"}
TRACE_FIELDS = {"trace_id", "span_id"}
# What a terminal must never get raw: C0 controls but the line's own end, DEL, C1 controls.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


@contextmanager
def written(fmt: str, logger: str = "toolbus") -> Iterator[io.StringIO]:
    """Every record of `logger` at DEBUG and above, as the worker's handler writes it."""
    stream = io.StringIO()  # not a terminal: `auto` would be JSON, `text` is colourless
    handler = log_handler(fmt, stream)
    target = logging.getLogger(logger)
    previous = target.level
    target.addHandler(handler)
    target.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        target.removeHandler(handler)
        target.setLevel(previous)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    text.encode()  # valid UTF-8: what a file or a pipe can take, whatever a caller sent
    return [json.loads(line) for line in text.split("\n")[:-1]]  # a line ends at "\n" only


def call_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [line for line in json_lines(stream) if line["event"] == "call"]


# -- the JSON formatter -----------------------------------------------------------------


def record_at(created: float) -> logging.LogRecord:
    record = logging.LogRecord("toolbus.test", logging.INFO, __file__, 1, "at %s", (1,), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0  # as LogRecord computes it
    return record


def test_a_json_line_has_the_records_time_to_the_millisecond_in_utc() -> None:
    formatter = json_formatter()
    # One formatter across seconds, minutes and days: each line has its own time.
    for created in (1700000000.0, 1700000000.999, 1700000001.5, 1700000060.25, 1700086400.042):
        line = json.loads(formatter.format(record_at(created)))
        written_at = datetime.fromisoformat(line["ts"])
        assert written_at.utcoffset() is not None and not written_at.utcoffset()
        assert 0 <= created - written_at.timestamp() < 0.001 + 1e-6
        assert line["ts"].endswith("+00:00") and len(line["ts"].split("T")[1]) == len(
            "12:00:00.000+00:00"
        )


def test_a_json_line_carries_the_records_fields_at_the_top_level() -> None:
    record = record_at(1700000000.0)
    record.call_id, record.names = "c-1", ["a", "é"]
    record.odd = object()  # not JSON: written as its text, never fails the line
    record.huge = 2**70  # beyond what orjson encodes: the standard library's encoder takes it
    line = json.loads(json_formatter().format(record))
    assert (line["level"], line["logger"], line["event"]) == ("info", "toolbus.test", "at 1")
    assert (line["call_id"], line["names"], line["huge"]) == ("c-1", ["a", "é"], 2**70)
    assert line["odd"].startswith("<object")
    assert not TRACE_FIELDS & set(line)  # no span, no trace ids


def test_a_json_line_under_a_span_carries_its_trace_and_span_ids() -> None:
    record = record_at(1700000000.0)
    with TracerProvider().get_tracer("test").start_as_current_span("outer") as span:
        line = json.loads(json_formatter().format(record))
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


# -- the call line -----------------------------------------------------------------------


async def test_the_json_call_line_has_exactly_its_fields_with_their_types() -> None:
    rig = standard_rig()
    with written("json") as out:
        reply = await rig.call("echo", {"arguments": {"text": "hi"}, "caller": "kitchen"})
    [line] = call_lines(out)
    assert set(line) == LINE_FIELDS | CALL_FIELDS | TRACE_FIELDS
    assert (line["level"], line["logger"]) == ("info", "toolbus.execute")
    assert (line["call_id"], line["tool"], line["outcome"]) == (reply["id"], "echo", "ok")
    assert line["caller"] == "kitchen"
    assert type(line["duration_ms"]) in (int, float) and 0 <= line["duration_ms"] < 60_000
    assert line["argument_bytes"] == {"text": 4}  # "hi" with its quotes
    # The ids of the trace the reply names, and of one of its spans.
    spans = rig.spans.get_finished_spans()
    assert line["trace_id"] == reply["trace_id"]
    assert line["span_id"] in {format(s.context.span_id, "016x") for s in spans if s.context}


@pytest.mark.parametrize(
    ("tool", "arguments", "outcome"),
    [
        ("no_such_tool", {"a": 1}, "unknown_tool"),
        ("explode", {}, "tool_error"),
        ("busy", {"n": "not a number"}, "invalid_arguments"),
    ],
)
async def test_a_failed_call_line_names_its_error_code(
    tool: str, arguments: dict[str, Any], outcome: str
) -> None:
    rig = standard_rig()
    with written("json") as out:
        reply = await rig.call(tool, {"arguments": arguments})
    [line] = call_lines(out)
    assert (line["call_id"], line["tool"], line["outcome"]) == (reply["id"], tool, outcome)
    assert reply["error"]["code"] == outcome
    assert line["caller"] is None  # the request named none
    assert line["level"] == "info"  # a failed call is an answer, not a worker's problem


async def test_the_terminal_line_is_time_level_event_tool_outcome_duration_then_fields() -> None:
    rig = standard_rig()
    with written("text") as out:
        reply = await rig.call("echo", {"arguments": {"text": "hi"}, "caller": "kitchen"})
    [line] = [t for t in out.getvalue().splitlines() if " call " in t]
    shape = r"\d\d:\d\d:\d\d\.\d{3} INFO  call echo ok (\d+\.\d)ms call_id=(\S+) caller=kitchen "
    match = re.match(shape, line)
    assert match is not None, line
    assert match[2] == reply["id"]
    assert 'argument_bytes={"text":4}' in line and f"trace_id={reply['trace_id']}" in line


@pytest.mark.parametrize(("slow_call_ms", "slow"), [(1, True), (60_000, False)])
async def test_a_slow_call_line_is_a_warning_marked_slow(slow_call_ms: int, slow: bool) -> None:
    # A 20 ms call against a 1 ms threshold, and against a minute: no race either way.
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, slow_call_ms=slow_call_ms)
    with written("json") as out:
        await rig.call("busy", {"arguments": {"n": 1, "hold_ms": 20}})
    lines = json_lines(out)
    [line] = [line for line in lines if line["event"] == "call"]
    assert line["outcome"] == "ok" and line["duration_ms"] >= 20
    assert line.get("slow", False) is slow
    assert line["level"] == ("warning" if slow else "info")
    # The fast call is not flagged in any way: no warning anywhere.
    assert any(line["level"] == "warning" for line in lines) is slow


ARGUMENTS: dict[str, Any] = {
    "plain": "Switch One",
    "quoted": 'say "hi"',
    "backslash": "C:\\path",
    "newline": "two\nlines",
    "unicode": "Küche ☕",
    "delete": "\x7f",
    "number": 12345,
    "negative": -7,
    "float": 1.5,
    "yes": True,
    "no": False,
    "nothing": None,
    "list": [1, "a", None],
    "object": {"k": {"deep": [True]}},
}


@pytest.mark.parametrize("name", list(ARGUMENTS))
async def test_the_call_line_measures_each_argument_as_compact_utf8_json(name: str) -> None:
    value = ARGUMENTS[name]
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    with written("json") as out:
        await standard_rig().call("no_such_tool", {"arguments": {name: value}})
    [line] = call_lines(out)
    assert line["argument_bytes"] == {name: len(compact)}


# -- argument values ----------------------------------------------------------------------

SECRET = "Flat 3, 12 Quiet Lane"  # distinctive: in a log only if a value leaked there


async def log_of_calls_carrying_a_secret(rig: Rig, fmt: str) -> str:
    """Calls that succeed, fail in the tool, fail validation and name no tool, each with
    the secret in its arguments; every line at any level, as the worker writes it."""
    with written(fmt) as out:
        assert (await rig.call("echo", {"arguments": {"text": SECRET}}))["ok"]
        codes = [
            (await rig.call(tool, {"arguments": arguments}))["error"]["code"]
            for tool, arguments in [
                ("explode", {"reason": SECRET}),
                ("busy", {"n": SECRET}),
                ("no_such_tool", {"where": SECRET}),
            ]
        ]
    assert codes == ["tool_error", "invalid_arguments", "unknown_tool"]
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_argument_values_are_not_logged_by_default(fmt: str) -> None:
    logged = await log_of_calls_carrying_a_secret(standard_rig(), fmt)
    assert SECRET not in logged
    assert "Quiet Lane" not in logged


async def test_without_log_arguments_a_line_has_names_and_sizes_and_a_failure_its_stack() -> None:
    logged = io.StringIO(await log_of_calls_carrying_a_secret(standard_rig(), "json"))
    lines = json_lines(logged)
    [echo] = [line for line in lines if line["event"] == "call" and line["tool"] == "echo"]
    assert echo["argument_bytes"] == {"text": len(SECRET) + 2}
    assert "arguments" not in echo
    # The failing tool's stack is logged, without its message.
    [failure] = [line for line in lines if line["logger"] == "toolbus.local"]
    assert failure["level"] == "error" and failure["exception_type"] == "ValueError"
    assert (failure["tool"], "exception" in failure) == ("explode", False)
    assert "explode" in failure["stack"]  # where it was raised: the tool's own frame


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_argument_values_are_logged_with_log_arguments(fmt: str) -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, log_arguments=True)
    logged = await log_of_calls_carrying_a_secret(rig, fmt)
    if fmt == "json":
        lines = json_lines(io.StringIO(logged))
        [echo] = [line for line in lines if line["event"] == "call" and line["tool"] == "echo"]
        assert json.loads(echo["arguments"]) == {"text": SECRET}
        [failure] = [line for line in lines if line["logger"] == "toolbus.local"]
        assert SECRET in failure["exception"]
    else:
        # The arguments' JSON holds spaces: one logfmt value, quoted with JSON's escapes.
        text = json.dumps({"text": SECRET}, separators=(",", ":"))
        assert f"arguments={json.dumps(text)}" in logged


# -- a caller's hostile keys and values -----------------------------------------------------

HOSTILE = {
    "line\nbreak\r": "two\nlines\r\n",
    "esc\x1b[2J": "\x1b[31mred\x00\x07",
    "c1\x85\x9b": "next\x85line\u2028sep",
}


def assert_one_line_per_record(text: str, records: int, fmt: str) -> None:
    assert text.endswith("\n") and text.count("\n") == records
    assert RAW_CONTROL.search(text) is None
    if fmt == "json":
        for line in text.split("\n")[:-1]:
            json.loads(line)


@pytest.mark.parametrize("log_arguments", [False, True])
@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_hostile_keys_and_values_stay_on_one_line(fmt: str, log_arguments: bool) -> None:
    probe = Probe()
    rig = rig_for(probe_tools(probe), probe, log_arguments=log_arguments)
    with written(fmt, "toolbus.execute") as out:
        await rig.call("no_such_tool", {"arguments": HOSTILE})
    text = out.getvalue()
    assert_one_line_per_record(text, 1, fmt)
    assert ("red" in text) is log_arguments and ("lines" in text) is log_arguments


@pytest.mark.parametrize("log_arguments", [False, True])
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_lone_surrogates_stay_on_one_line_as_valid_utf8(fmt: str, log_arguments: bool) -> None:
    # Decoding refuses them in a request; a line must survive them all the same.
    arguments = {"\udc80key\n": "\ud800value\n", "ok": "fine"}
    call = Call(id="c-\udfff", tool="t\ud800", arguments=arguments, topic="tb/call/t")
    with written(fmt, "toolbus.execute") as out:
        log_call(
            call,
            arguments,
            tool=call.tool,
            outcome="ok",
            duration_ms=1.0,
            slow_call_ms=1000.0,
            log_arguments=log_arguments,
        )
    text = out.getvalue()
    assert_one_line_per_record(text, 1, fmt)
    assert ("value" in text) is log_arguments
    if fmt == "json":
        [line] = call_lines(out)
        assert set(line) == LINE_FIELDS | CALL_FIELDS | ({"arguments"} if log_arguments else set())


async def test_hostile_argument_names_are_escaped_and_bounded() -> None:
    names = {"line\nbreak": 1, "x" * 1000: 2, **{f"k{i}": i for i in range(200)}}
    with written("json", "toolbus.execute") as out:
        await standard_rig().call("no_such_tool", {"arguments": names})
    [line] = call_lines(out)
    assert len(line["argument_bytes"]) == LOGGED_NAMES
    assert line["argument_bytes"]["line\\nbreak"] == 1
    assert max(map(len, line["argument_bytes"])) == LOGGED_NAME_CHARS + len("...")
    assert len(out.getvalue()) < 2000


# -- other lines operators filter on ---------------------------------------------------------


async def test_a_dead_letter_line_has_the_topic_and_code() -> None:
    rig = standard_rig()
    with written("json", "toolbus.pipeline") as out:
        await rig.request("no_such_tool", {}, response_topic=None)
    assert [letter["error"]["code"] for letter in rig.dead()] == ["unknown_tool"]
    [line] = [line for line in json_lines(out) if line["event"] == "dead letter"]
    assert (line["level"], line["topic"], line["code"]) == (
        "warning",
        "tb/call/no_such_tool",
        "unknown_tool",
    )


async def test_a_rejected_message_line_has_the_topic_and_code() -> None:
    rig = standard_rig()
    with written("json", "toolbus.pipeline") as out:
        await rig.request(None, b"not json at all")
    [line] = [line for line in json_lines(out) if line["event"] == "rejected message"]
    assert (line["topic"], line["code"]) == ("tb/call", "bad_request")


@pytest.mark.parametrize("other_server", [False, True])
def test_the_mcp_start_up_failure_says_it_in_its_text_and_its_fields(other_server: bool) -> None:
    """The seed's words are the line's text, not only its fields; "local tools only"
    only while no other MCP server's tool is served."""
    from toolbus.backends.mcp.retry import log_exhausted  # here: it loads the mcp SDK

    registry = Registry()
    registry.register_all(tool.to_tool() for tool in BUILTIN_TOOLS)
    if other_server:
        registry.register(mcp_tool("lamp"))
    with written("json", "toolbus.mcp") as out:
        log_exhausted("zwave", 3, "ConnectionError: exit 2", ["no broker"], registry)
    [line] = json_lines(out)
    assert line["event"].startswith(
        "MCP connection failed after 3 attempts (server zwave): ConnectionError: exit 2. "
        "MCP server stderr: no broker. Continuing in degraded mode ("
    )
    assert ("degraded mode (local tools only)" in line["event"]) is not other_server
    assert "Hint: check the MQTT broker and MCP server configuration" in line["event"]
    assert (line["server"], line["attempts"], line["stderr_tail"]) == ("zwave", 3, ["no broker"])


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("kitchen", "kitchen"),
        ("two words", '"two words"'),
        ("", '""'),
        ("k=v", '"k=v"'),
        ('say "hi"', '"say \\"hi\\""'),
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (2.5, "2.5"),
        ({"text": 4}, '{"text":4}'),
        (["a", "b"], '["a","b"]'),
        ({"a": "b c"}, '"{\\"a\\":\\"b c\\"}"'),
        (logging.INFO, "20"),
    ],
)
def test_a_terminal_field_is_logfmt_never_a_repr(value: object, shown: str) -> None:
    assert logfmt_value(value) == shown


def test_the_terminal_line_quotes_only_what_needs_it() -> None:
    with written("text") as out:
        logging.getLogger("toolbus.t").info(
            "stopping",
            extra={"reason": "session taken over", "servers": {"a": "ready"}, "ok": False},
        )
    line = out.getvalue()
    assert line.rstrip("\n").endswith(
        ' stopping reason="session taken over" servers={"a":"ready"} ok=false'
    ), line


def test_a_tool_name_cannot_pass_for_another_call_s_fields() -> None:
    """An unknown tool's name is the caller's word: with spaces in it, written bare, it
    read as `light_off ok 0.2ms call_id=9 caller=admin` before the real outcome."""
    forged = "light_off ok 0.2ms call_id=9 caller=admin"
    with written("text") as out:
        logging.getLogger("toolbus.t").info(
            "call",
            extra={"tool": forged, "outcome": "unknown_tool", "caller": "mallory"},
        )
    line = out.getvalue()
    assert f" call {json.dumps(forged)} unknown_tool " in line, line
    assert " caller=mallory" in line and " caller=admin " not in line
