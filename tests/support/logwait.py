"""Waiting on log records as events (never polling, never sleeping)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager


class LogSeen(logging.Handler):
    """Sets `seen` when a record from `logger` at `level` or above containing `text` arrives."""

    def __init__(self, text: str = "", level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.text = text
        self.seen = asyncio.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.text in record.getMessage():
            self.seen.set()


@contextmanager
def watching(logger_name: str, text: str = "", level: int = logging.INFO) -> Iterator[LogSeen]:
    logger = logging.getLogger(logger_name)
    handler = LogSeen(text, level)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, previous) if previous else level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
