"""Lines from a pipe, bounded: whole lines up to a limit, only the ends of longer ones.

A stdio MCP server sends one JSON-RPC message per line; its stderr is lines of text.
Either may be a line of any length. `LineSplitter` keeps at most `limit_bytes` of a
line in memory and touches each byte a fixed number of times, whatever the line's
length: a line over the limit becomes an `Oversized` with its size, its first and its
last bytes. `answered_id` finds, in those ends, which request an oversized JSON-RPC
response answers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

END_BYTES = 1024
"""How much of each end of an oversized line is kept: room for the envelope's keys."""


@dataclass(frozen=True)
class Oversized:
    """A line longer than the limit: its size and its ends, the middle never kept."""

    size_bytes: int
    head: bytes
    tail: bytes


class LineSplitter:
    """Splits a byte stream into lines (without their `\\n`), each at most `limit_bytes`.

    A line still open when the stream ends is not returned by `feed`; `rest` has it.
    After each `feed`, `carried` is how many bytes of its first line came from earlier
    feeds (0: none, or the line is oversized).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.carried = 0
        self._line = bytearray()
        self._over = 0  # the size of an oversized line so far; 0 while within the limit
        self._head = b""
        self._tail = b""

    def feed(self, data: bytes) -> list[bytes | Oversized]:
        """The lines that `data` completes, in order."""
        lines: list[bytes | Oversized] = []
        start = 0
        self.carried = 0
        while (end := data.find(b"\n", start)) >= 0:
            if end - start <= self.limit_bytes and not self._line and not self._over:
                lines.append(data[start:end])  # whole within this chunk: copied once, not thrice
            else:
                before = len(self._line) if start == 0 else 0
                self._take(data[start:end])
                if not self._over:  # an oversized line is never taken apart
                    self.carried = before
                lines.append(self._complete())
            start = end + 1
        if start < len(data):
            self._take(data[start:])
        return lines

    @property
    def open(self) -> bool:
        """Whether a line has begun and not yet ended."""
        return bool(self._line) or self._over > 0

    def rest(self) -> bytes | Oversized | None:
        """The line still open (no newline yet), if any; the splitter starts afresh."""
        if not self._over and not self._line:
            return None
        return self._complete()

    def _take(self, piece: bytes) -> None:
        if self._over:  # already too long: count it, keep the last bytes
            self._over += len(piece)
            self._tail = (self._tail + piece[-END_BYTES:])[-END_BYTES:]
        elif len(self._line) + len(piece) > self.limit_bytes:
            self._over = len(self._line) + len(piece)
            self._head = (bytes(self._line[:END_BYTES]) + piece[:END_BYTES])[:END_BYTES]
            self._tail = (bytes(self._line[-END_BYTES:]) + piece[-END_BYTES:])[-END_BYTES:]
            self._line = bytearray()  # a new one: the old one's memory goes back
        else:
            self._line += piece

    def _complete(self) -> bytes | Oversized:
        if self._over:
            line: bytes | Oversized = Oversized(self._over, self._head, self._tail)
            self._over, self._head, self._tail = 0, b"", b""
            return line
        whole = bytes(self._line)
        self._line.clear()
        return whole


# What JSON-RPC 2.0 responses look like at their ends, as SDKs write them: the Python
# SDK puts `jsonrpc` and `id` first, the TypeScript one puts `id` last. Anchored at the
# start or end of the line, these match keys of the top-level object only.
_VERSION = rb'"jsonrpc"\s*:\s*"2\.0"\s*,\s*'
_ID = rb'(-?\d{1,19}|"(?:[^"\\]|\\.){0,256}")'
_ID_FIRST = re.compile(
    rb"^\s*\{\s*(?:" + _VERSION + rb')?"id"\s*:\s*' + _ID + rb"\s*,\s*"
    rb"(?:" + _VERSION + rb')?"(?:result|error)"\s*:'
)
_RESULT_FIRST = re.compile(rb"^\s*\{\s*(?:" + _VERSION + rb')?"(?:result|error)"\s*:')
_ID_LAST = re.compile(
    rb'[,{]\s*"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$'
)


def answered_id(line: Oversized) -> int | str | None:
    """The id of the request an oversized line answers, when its ends show it."""
    found = _ID_FIRST.match(line.head)
    if found is None and _RESULT_FIRST.match(line.head):
        found = _ID_LAST.search(line.tail)
    if found is None:
        return None
    try:
        ident = json.loads(found.group(1))
    except ValueError:
        return None
    return ident if isinstance(ident, int | str) else None


def looks_like_json_object(line: Oversized) -> bool:
    """Whether the line starts as a JSON object would (and so might be a message)."""
    return line.head.lstrip().startswith(b"{")
