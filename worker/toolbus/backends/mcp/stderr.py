"""A stdio server's stderr: each line to the log `toolbus.mcp.{server}`, a tail kept.

The pipe is read by a protocol, as its data arrives, not by a task: most servers log a
line per call, and a task reading through an anyio stream cost each call a future, a
task step and a buffer copy besides the line itself. The lines are split by
`LineSplitter`, so a line of any length holds at most `STDERR_LINE_BYTES` in memory
(a longer one is logged cut, never fatal). The holder's `tail`, a bounded deque, keeps
the last lines, each cut to `STDERR_LINE_CHARS`, for error reports; a `StderrTail` also
counts them, so that a report can show each attempt's lines once (`by_attempt`).

The pipe is made, and read, before the server's process starts, so that starting the
process is the last await before the transport's task group: no cancellation between
the two can leave a process running.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Sequence
from io import FileIO

from toolbus.backends.mcp.lines import LineSplitter, Oversized

STDERR_LINE_BYTES = 8 * 1024  # a stderr line longer than this is logged cut
STDERR_LINE_CHARS = 500  # of each stderr line kept in the tail for error reports


class StderrTail(deque[str]):
    """The last lines of a server's stderr, over all its starts, and how many there were:
    `appended` before an attempt marks where that attempt's lines begin."""

    def __init__(self, maxlen: int) -> None:
        super().__init__(maxlen=maxlen)
        self.appended = 0

    def append(self, line: str) -> None:
        super().append(line)
        self.appended += 1


def by_attempt(tail: StderrTail, marks: Sequence[int]) -> tuple[list[str], list[str]]:
    """The lines of the attempts that began at `marks` (`appended` then), each attempt's
    once: an attempt that wrote what the one before it wrote is not shown again (a server
    failing the same way at each start would repeat its traceback at each attempt).
    Returns the lines, and the same with a note where attempts were alike, for the text."""
    lines: list[str] = []
    noted: list[str] = []
    kept, first = list(tail), tail.appended - len(tail)  # `first`: the oldest kept's count
    blocks = [
        kept[max(start, first) - first : max(end, first) - first]
        for start, end in zip(marks, [*marks[1:], tail.appended], strict=True)
    ]
    number = 0
    while number < len(blocks):
        alike = number
        while alike + 1 < len(blocks) and blocks[alike + 1] == blocks[number]:
            alike += 1
        lines += blocks[number]
        noted += blocks[number]
        if alike > number and blocks[number]:
            noted.append(f"(the same at attempts {number + 1} to {alike + 1})")
        number = alike + 1
    return lines, noted


class StderrLines(asyncio.Protocol):
    """Lines from a server's stderr, each logged and kept in `tail` as it completes."""

    def __init__(self, name: str, tail: deque[str]) -> None:
        self._splitter = LineSplitter(STDERR_LINE_BYTES)
        self._tail = tail
        self._log = logging.getLogger(f"toolbus.mcp.{name}")
        self._fields = {"server": name}  # a terminal line shows no logger name: this says whose

    def data_received(self, data: bytes) -> None:
        for line in self._splitter.feed(data):
            self._line(line)

    def eof_received(self) -> None:
        self._last()

    def connection_lost(self, exc: Exception | None) -> None:
        self._last()

    def _last(self) -> None:
        rest = self._splitter.rest()
        if rest is not None:  # a last line without its newline (a crash, say)
            self._line(rest)

    def _line(self, line: bytes | Oversized) -> None:
        if isinstance(line, Oversized):
            start = line.head.decode("utf-8", "replace")
            text = f"{start}… [cut: a line of {line.size_bytes} bytes]"
        else:
            text = line.decode("utf-8", "replace").rstrip()
        if text:
            self._tail.append(text[:STDERR_LINE_CHARS])
            self._log.info("%s", text, extra=self._fields)


class StderrPipe:
    """A pipe for a server's stderr, read by `StderrLines` from the moment it exists.

    Give `write_fd` to the process, then call `given()`: the server then holds the only
    write end, and its exit (with its children's) ends the stream. `close()` stops reading.
    """

    def __init__(self, transport: asyncio.ReadTransport, write_fd: int) -> None:
        self._transport = transport
        self.write_fd = write_fd
        self._given = False

    @classmethod
    async def open(cls, name: str, tail: deque[str]) -> StderrPipe:
        reader, write_fd = _pipe()
        try:
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: StderrLines(name, tail), reader
            )
        except BaseException:
            reader.close()
            os.close(write_fd)
            raise
        return cls(transport, write_fd)

    def given(self) -> None:
        """The process has its copy of the write end: ours is closed."""
        if not self._given:
            self._given = True
            os.close(self.write_fd)

    def close(self) -> None:
        self.given()
        self._transport.close()


def _pipe() -> tuple[FileIO, int]:
    """A new pipe: its read end as a file (the transport that reads it closes it), its
    write end as a descriptor."""
    read_fd, write_fd = os.pipe()
    try:
        return FileIO(read_fd, "rb"), write_fd
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
