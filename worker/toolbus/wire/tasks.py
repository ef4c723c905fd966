"""Tasks: stopping one of ours and waiting until it has stopped.

`task.cancel()` only asks; a task left to finish on its own may still run (and log)
after its owner has moved on. Every owner that cancels a task waits for it here.
"""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[None], timeout_s: float | None = None) -> None:
    """Cancel `task` and return once it has finished (within `timeout_s`, if given).
    Its own error, if it ended with one before the cancel took, is raised."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        async with asyncio.timeout(timeout_s):
            await task
