"""bench/loop_turns.py's counter, loaded by a `toolbus serve` it starts (this folder first
on its PYTHONPATH): turns of the event loop, tasks made, and callbacks scheduled by name,
written to `TOOLBUS_BENCH_COUNT_TURNS` on SIGUSR1. Does nothing without that variable."""

from __future__ import annotations

import asyncio.base_events
import collections
import os
import signal
from typing import Any

_PATH = os.environ.get("TOOLBUS_BENCH_COUNT_TURNS")

if _PATH:
    _turns = [0, 0]
    _named: collections.Counter[str] = collections.Counter()
    _loop = asyncio.base_events.BaseEventLoop
    _run_once, _create_task, _call_soon = _loop._run_once, _loop.create_task, _loop.call_soon

    def _counted_run_once(self: Any) -> None:
        _turns[0] += 1
        _run_once(self)

    def _counted_create_task(self: Any, coro: Any, *args: Any, **kwargs: Any) -> Any:
        _turns[1] += 1
        _named["task " + getattr(coro, "__qualname__", type(coro).__name__)] += 1
        return _create_task(self, coro, *args, **kwargs)

    def _counted_call_soon(self: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
        _named["callback " + getattr(callback, "__qualname__", type(callback).__name__)] += 1
        return _call_soon(self, callback, *args, **kwargs)

    def _write(*_: object) -> None:
        with open(_PATH, "w") as out:
            out.write(f"{_turns[0]}\t{_turns[1]}\t{dict(_named)!r}\n")

    _loop._run_once = _counted_run_once  # type: ignore[method-assign]
    _loop.create_task = _counted_create_task  # type: ignore[method-assign]
    _loop.call_soon = _counted_call_soon  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _write)
