"""Logging: one line per event; JSON when not on a terminal, readable text on one."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


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
    # paho/aiomqtt and the MCP SDK are chatty at INFO; their warnings still show.
    for noisy in ("mqtt", "mcp", "httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # The SDK logs each unparseable stdout line with a traceback; the MCP backend logs
    # and counts them itself, once per line.
    logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)
