"""`toolbus call --progress`: a call's progress updates on stderr, as they come.

On a terminal, a rich progress bar (rich draws the status page's tables already, so it
costs no new dependency, and it redraws one line in place; tqdm would be a second
library for the same bar). Piped, one plain line per update (`progress 3/10 message`),
which a log or a `grep` reads. The message is the tool's text: shown printable only.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from toolbus.wire.contracts import Progress as Update
from toolbus.wire.untrusted import printable


class ProgressView:
    """Call it with each `Progress` update; use it as a context manager around the call."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        if stream.isatty():
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                console=Console(file=stream),
                transient=True,  # the reply, not a finished bar, is what stays
            )

    def __enter__(self) -> Self:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, update: Update) -> None:
        message = printable(update.message or "")
        if self._bar is None:
            total = "" if update.total is None else f"/{update.total:g}"
            line = f"progress {update.progress:g}{total}"
            print(f"{line} {message}" if message else line, file=self._stream, flush=True)
            return
        if self._task is None:
            self._task = self._bar.add_task(message, total=update.total)
        self._bar.update(
            self._task, completed=update.progress, total=update.total, description=message
        )
