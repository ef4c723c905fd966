"""Call log: the one line per call, with each argument's name and size, values only when
configured (they may be personal data), built only when it will be written."""

from __future__ import annotations

import json
import logging
from typing import Any

from toolbus.decode import Call

# The executor's logger: operators filter the per-call line by this name.
log = logging.getLogger("toolbus.execute")

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
    """One line per call. Argument values only with `log_arguments`: they may be
    personal data. Without it the line names each argument and its size."""
    outcome_text = outcome
    level = logging.INFO
    if duration_ms > slow_call_ms:
        level = logging.WARNING
        outcome_text += f" (slow: over {slow_call_ms:g} ms)"
    if not log.isEnabledFor(level):
        return  # no line: the arguments need not be measured
    sizes = {name: _json_bytes(value) for name, value in arguments.items()}
    if log_arguments:
        shown = repr(arguments)
        if len(shown) > LOGGED_ARGUMENTS_CHARS:
            shown = shown[:LOGGED_ARGUMENTS_CHARS] + "...}"
    else:
        shown = _names_and_sizes(sizes)
    log.log(
        level,
        "call %s tool=%s arguments=%s duration_ms=%.1f outcome=%s",
        call.id,
        tool,
        shown,
        duration_ms,
        outcome_text,
        extra={
            "call_id": call.id,
            "tool": tool,
            "outcome": outcome_text,
            "argument_names": [_loggable_name(name) for name in list(sizes)[:LOGGED_NAMES]],
            "argument_bytes": sum(sizes.values()),
        },
    )


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


def _names_and_sizes(sizes: dict[str, int]) -> str:
    """`[device_name:12B, level:1B]`: what a call carried, without what it said."""
    shown = "[" + ", ".join(f"{_loggable_name(n)}:{size}B" for n, size in sizes.items()) + "]"
    if len(shown) > LOGGED_ARGUMENTS_CHARS:
        shown = shown[:LOGGED_ARGUMENTS_CHARS] + "...]"
    return shown
