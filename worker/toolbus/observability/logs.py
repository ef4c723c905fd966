"""Logging: one line per event, its data in fields; JSON off a terminal, a compact line on one.

Call sites stay the standard library's (`logging.getLogger(name)`): the message is a
short event name (`call`, `dead letter`) and the data goes in `extra`. The lines are
made by structlog's `ProcessorFormatter`, a chain of processors from the record to an
event dict to text: `JSONRenderer` (one object per line, every field at the top level)
or `ConsoleRenderer` (`12:01:02.345 INFO  call echo ok 1.2ms call_id=... caller=...`).

At INFO a worker writes a line per call, so a line must cost little: JSON is encoded
by orjson (falling back to the standard library for what orjson refuses, a lone
surrogate), the timestamp is the record's own, formatted once a second, and
`setup_logging` turns off what no line shows (the caller's file and line, thread and
process names: the "Optimization" section of the logging HOWTO).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
import structlog
from opentelemetry import trace
from structlog.dev import Column, ColumnFormatter, ConsoleRenderer
from structlog.typing import EventDict, Processor, WrappedLogger

from toolbus.wire.untrusted import printable

# Five letters at most, so the events line up.
_SHORT_LEVELS = {"warning": "WARN", "critical": "CRIT"}
# Written where the line has ended: a traceback after the terminal line, a field in JSON.
_MULTILINE = frozenset({"exception", "stack", "exc_info"})


class _RecordTime:
    """`ts`: the record's creation time in UTC, ISO 8601 to the millisecond logging keeps
    (`msecs`); the date and time of day are formatted once a second, not per line.
    (structlog's `TimeStamper` reads the clock when formatting, not the record's time.)"""

    def __init__(self) -> None:
        self._second = -1
        self._second_text = ""

    def __call__(self, _: WrappedLogger, __: str, event: EventDict) -> EventDict:
        record: logging.LogRecord = event["_record"]
        second = int(record.created)
        if second != self._second:
            moment = datetime.fromtimestamp(second, UTC)
            self._second_text = moment.isoformat(timespec="seconds").removesuffix("+00:00")
            self._second = second
        event["ts"] = f"{self._second_text}.{int(record.msecs):03d}+00:00"
        return event


class _LocalTime:
    """`ts` for a terminal: the local time of day to the millisecond, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._clock = ""

    def __call__(self, _: WrappedLogger, __: str, event: EventDict) -> EventDict:
        record: logging.LogRecord = event["_record"]
        second = int(record.created)
        if second != self._second:
            self._clock = time.strftime("%H:%M:%S", time.localtime(second))
            self._second = second
        event["ts"] = f"{self._clock}.{int(record.msecs):03d}"
        return event


def add_trace_ids(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """`trace_id` and `span_id` of the current span, so logs join traces (a record that
    names its own keeps them)."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid and "trace_id" not in event:
        event["trace_id"] = format(context.trace_id, "032x")
        event["span_id"] = format(context.span_id, "016x")
    return event


def _printable_values(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """A terminal shows strings as they are: a caller's newline or escape sequence in
    one would start a line of its own or rewrite the screen, so each is escaped."""
    for key, value in event.items():
        # `isprintable` first: a C loop, where the escaping is a regular expression.
        if type(value) is str and not value.isprintable() and key not in _MULTILINE:
            event[key] = printable(value)
    return event


def _drop_own_logger(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """On a terminal the event names what happened; only a library's logger is shown."""
    if event["logger"].startswith("toolbus"):
        del event["logger"]
    return event


def _dumps(event: object, **_: Any) -> str:
    """orjson, else the standard library for what orjson refuses (a lone surrogate, an
    integer beyond 64 bits), ASCII-escaped so the line stays valid UTF-8.

    orjson escapes C0 controls but writes DEL and C1 controls as they are, and a terminal
    that shows the line (`tail -f`, `toolbus mappings`) runs U+009B as a CSI: those are
    escaped too (as JSON escapes: the same values). Checked in C first: most lines are ASCII.
    """
    try:
        line = orjson.dumps(event, default=str).decode()
    except TypeError:
        return json.dumps(event, default=str, separators=(",", ":"))
    return line if line.isascii() and "\x7f" not in line else printable(line)


def logfmt_value(value: object) -> str:
    """A field's value on the terminal line, logfmt-style: a string as it is, in double
    quotes (with JSON's escapes) where it is empty or holds white space, `=` or `"`; a
    number as it is; `true`, `false`, `null`; a dict or list as compact JSON
    (`{"text":4}`), quoted only where it holds white space. Python's reprs
    (`{'text': 4}`, `None`) meant nothing to an operator, and a bare value with a space
    read as two fields. (Machines read the JSON lines: they keep every value's type.)"""
    kind = type(value)
    if isinstance(value, str) and kind is str:  # made printable before (`_printable_values`)
        text = value
        return text if text and _PLAIN.fullmatch(text) else json.dumps(text, ensure_ascii=False)
    if kind is int or kind is float:
        return repr(value)  # never quoted: the common case, kept cheap
    if value is None or kind is bool or isinstance(value, dict | list | tuple):
        text = _dumps(value)
        return text if _NO_SPACE.fullmatch(text) else json.dumps(text, ensure_ascii=False)
    text = str(value)  # an enum, a path, an exception: what it says of itself
    return logfmt_value(text if text.isprintable() else printable(text))


# Values that need no quotes: a string without white space, `=` or `"`; JSON without
# white space (its own quotes and brackets delimit it).
_PLAIN = re.compile(r'[^\s="]+')
_NO_SPACE = re.compile(r"\S+")


# What every record goes through first: the fields a line is made of.
def _fields(timestamp: Processor) -> list[Processor]:
    return [
        timestamp,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        add_trace_ids,
    ]


def json_formatter() -> logging.Formatter:
    """One JSON object per line: `ts`, `level`, `logger`, `event`, then every field the
    record was given, `trace_id`/`span_id` under a span, `exception` as text."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_fields(_RecordTime()),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ],
    )


def console_formatter(*, colors: bool) -> logging.Formatter:
    """`12:01:02.345 INFO  call echo ok 1.2ms call_id=... caller=...`: time, level, event,
    the call's tool, outcome and duration when it has them, then the other fields."""
    styles = ConsoleRenderer.get_default_column_styles(colors)
    levels = ConsoleRenderer.get_default_level_styles(colors)
    reset = styles.reset

    # Columns as plain functions: structlog's `KeyValueColumnFormatter` builds a
    # StringIO per field, which made the line several times dearer.
    def value(style: str, render: Callable[[Any], str] = str) -> ColumnFormatter:
        return lambda _, shown: f"{style}{render(shown)}{reset}"

    def level(key: str, value: object) -> str:
        name = str(value)
        return f"{levels.get(name, '')}{_SHORT_LEVELS.get(name, name.upper()):<5}{reset}"

    def field(key: str, value: object) -> str:
        return f"{styles.kv_key}{key}{reset}={styles.kv_value}{logfmt_value(value)}{reset}"

    renderer = ConsoleRenderer(
        columns=[
            Column("ts", value(styles.timestamp)),
            Column("level", level),
            Column("event", value(styles.bright)),
            # The tool is the caller's word for an unknown one: quoted where it holds a
            # space, it cannot pass for the outcome and fields of another call.
            Column("tool", value(styles.bright, logfmt_value)),
            Column("outcome", value(styles.bright, logfmt_value)),
            Column("duration_ms", value(styles.bright, lambda ms: f"{ms:.1f}ms")),
            Column("", field),
        ],
        sort_keys=False,  # the order the record gave: call_id, caller, ...
        # The plain traceback: rich's shows local variables, which may hold the
        # argument values `log_arguments` keeps out of the log.
        exception_formatter=structlog.dev.plain_traceback,
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_fields(_LocalTime()),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _drop_own_logger,
            _printable_values,
            renderer,
        ],
    )


def log_handler(fmt: str = "auto", stream: TextIO | None = None) -> logging.Handler:
    """A handler writing to `stream` (stderr): JSON for `json`, or for `auto` off a
    terminal; the compact console line otherwise."""
    out = sys.stderr if stream is None else stream
    terminal = out.isatty()
    use_json = fmt == "json" or (fmt == "auto" and not terminal)
    handler = logging.StreamHandler(out)
    handler.setFormatter(json_formatter() if use_json else console_formatter(colors=terminal))
    return handler


def setup_logging(level: str = "INFO", fmt: str = "auto", stream: TextIO | None = None) -> None:
    root = logging.getLogger()
    root.handlers[:] = [log_handler(fmt, stream)]
    root.setLevel(level.upper())
    # No line shows where a record was made, in which thread or process; finding out
    # walks the stack and asks the threading module for every record.
    logging._srcfile = None  # the documented switch (logging HOWTO, "Optimization")
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # paho/aiomqtt and the MCP SDK are chatty at INFO; their warnings still show.
    for noisy in ("mqtt", "mcp", "httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # The SDK logs each unparseable stdout line with a traceback; the MCP backend logs
    # and counts them itself, once per line.
    logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)
