"""Call log: the one line per call, as fields: `call_id`, `tool`, `outcome` (`ok` or the
error code), `duration_ms`, `caller` and each argument's size in bytes (`argument_bytes`),
the values only when configured (they may be personal data); built only when written."""

from __future__ import annotations

import json
import logging
from itertools import islice
from typing import Any

from toolbus.calls.call import Call
from toolbus.wire.untrusted import printable

# The executor's logger: operators filter the per-call line by this name.
log = logging.getLogger("toolbus.execute")

CALL_EVENT = "call"  # the line's `event`: what `jq 'select(.event == "call")'` finds
LOGGED_ARGUMENTS_CHARS = 500
LOGGED_NAME_CHARS = 64  # a caller chooses the keys: they must not make a huge log line
LOGGED_NAMES = 50


def log_call(
    call: Call,
    arguments: dict[str, Any],
    *,
    tool: str,
    outcome: str,
    duration_ms: float,
    slow_call_ms: float,
    log_arguments: bool,
) -> None:
    """One line per call, a warning with `slow: true` past `slow_call_ms`. Argument
    values (`arguments`, their compact JSON, bounded) only with `log_arguments`: they may
    be personal data. Without it the line has each argument's name and size."""
    slow = duration_ms > slow_call_ms
    level = logging.WARNING if slow else logging.INFO
    if not log.isEnabledFor(level):
        return  # no line: the arguments need not be measured
    fields: dict[str, Any] = {
        "call_id": call.id,
        "tool": tool,
        "outcome": outcome,
        "duration_ms": round(duration_ms, 3),
        "caller": call.caller,
        "argument_bytes": {
            _loggable_name(name): _json_bytes(value)
            for name, value in islice(arguments.items(), LOGGED_NAMES)
        },
    }
    if log_arguments:
        # Printable, so a terminal or a line splitter meets no caller's control character;
        # each is written as its JSON escape, so the text still parses to the values.
        fields["arguments"] = printable(_bounded(_COMPACT_JSON(arguments), LOGGED_ARGUMENTS_CHARS))
    if slow:
        fields["slow"] = True
    log.log(level, CALL_EVENT, extra=fields)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}...(+{len(text) - limit} chars)"


# One encoder for every size: `json.dumps` with options builds a new one per call.
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
_LITERAL_BYTES = {True: 4, False: 5, None: 4}  # true, false, null


def _json_bytes(value: Any) -> int:
    """A value's size: its compact JSON, in UTF-8 bytes. Plain text and literals, most
    of what calls carry, are measured without encoding them."""
    kind = type(value)
    if kind is str and value.isascii() and value.isprintable():
        if '"' not in value and "\\" not in value:
            return len(value) + 2  # nothing to escape: the text and its quotes
    elif kind is int:
        return len(str(value))
    elif kind is bool or value is None:
        return _LITERAL_BYTES[value]
    text = _COMPACT_JSON(value)
    return len(text.encode("utf-8", "surrogatepass"))  # a lone surrogate still has a size


def _loggable_name(name: str) -> str:
    """An argument name fit for a log line: printable (else escaped) and bounded."""
    shown = name if name.isprintable() else repr(name)[1:-1]
    return shown if len(shown) <= LOGGED_NAME_CHARS else shown[:LOGGED_NAME_CHARS] + "..."
