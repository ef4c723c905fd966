"""Logging: one line per event; JSON when not on a terminal, readable text on one.

At INFO a worker writes a line per call, so a line must cost little: the JSON formatter
encodes with one prebuilt encoder and formats each second's timestamp once, and
`setup_logging` turns off what no line shows (the caller's file and line, thread and
process names: the "Optimization" section of the logging HOWTO).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
# One encoder for every line: `json.dumps` with options builds a new one per call.
_ENCODE = json.JSONEncoder(default=str, ensure_ascii=False).encode


class JsonFormatter(logging.Formatter):
    """`ts`, `level`, `logger`, `event`, then every field a record was given (`extra`)."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _ENCODE(entry)

    def _timestamp(self, record: logging.LogRecord) -> str:
        """ISO 8601 in UTC, to the millisecond logging itself keeps (`msecs`); the date
        and time of day are formatted once a second, not per line."""
        second = int(record.created)
        if second != self._second:
            moment = datetime.fromtimestamp(second, UTC)
            self._second_text = moment.isoformat(timespec="seconds").removesuffix("+00:00")
            self._second = second
        return f"{self._second_text}.{int(record.msecs):03d}+00:00"


class TraceIds(logging.Filter):
    """Adds the current span's `trace_id` and `span_id` to every record, so logs join traces."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


class TextFormatter(logging.Formatter):
    """Readable lines for a terminal, with the trace id when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        return f"{text} [trace {trace_id}]" if trace_id else text


def setup_logging(level: str = "INFO", fmt: str = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceIds())
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
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
