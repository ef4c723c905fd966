"""The log line: what the JSON formatter writes, and the per-call line's argument sizes."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import pytest

from tests.test_pipeline import standard_rig
from toolbus.observability.logs import JsonFormatter


def record_at(created: float) -> logging.LogRecord:
    record = logging.LogRecord("toolbus.test", logging.INFO, __file__, 1, "at %s", (1,), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0  # as LogRecord computes it
    return record


def test_a_json_line_has_the_records_time_to_the_millisecond_in_utc() -> None:
    formatter = JsonFormatter()
    # One formatter across seconds, minutes and days: each line has its own time.
    for created in (1700000000.0, 1700000000.999, 1700000001.5, 1700000060.25, 1700086400.042):
        line = json.loads(formatter.format(record_at(created)))
        written = datetime.fromisoformat(line["ts"])
        assert written.utcoffset() is not None and not written.utcoffset()
        assert 0 <= created - written.timestamp() < 0.001 + 1e-6
        assert line["ts"].endswith("+00:00") and len(line["ts"].split("T")[1]) == len(
            "12:00:00.000+00:00"
        )


def test_a_json_line_carries_the_records_fields() -> None:
    record = record_at(1700000000.0)
    record.call_id, record.names = "c-1", ["a", "é"]
    record.odd = object()  # not JSON: written as its text, never fails the line
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["event"]) == ("info", "toolbus.test", "at 1")
    assert (line["call_id"], line["names"]) == ("c-1", ["a", "é"])
    assert line["odd"].startswith("<object")


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
async def test_the_call_line_measures_each_argument_as_compact_utf8_json(
    caplog: pytest.LogCaptureFixture, name: str
) -> None:
    value = ARGUMENTS[name]
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    rig = standard_rig()
    with caplog.at_level(logging.INFO, logger="toolbus.execute"):
        await rig.call("no_such_tool", {"arguments": {name: value}})
    [line] = [r for r in caplog.records if hasattr(r, "call_id")]
    assert vars(line)["argument_bytes"] == len(compact)
    assert f"{name}:{len(compact)}B" in line.getMessage()
