"""How an MCP server's connection is retried: attempts, backoff, and stopping early.

Start-up makes `[mcp].startup_attempts` attempts with doubling delays; after that a
server is retried for as long as the worker runs, with capped, jittered backoff. Either
way a stopping worker ends the waiting at once (tenacity, with our stop and sleep).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from toolbus.config import McpPolicy


class Stopping(Exception):
    """The worker is stopping: no more attempts."""


class stop_when(stop_base):  # noqa: N801 -- named like tenacity's own stop strategies
    """Stop retrying once `predicate()` is true (the worker is stopping)."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        self._predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._predicate()


def connect_attempts(
    policy: McpPolicy,
    *,
    startup: bool,
    stopping: asyncio.Event,
    before_sleep: Callable[[RetryCallState], None],
) -> AsyncRetrying:
    """The attempts to (re)connect: bounded at start-up, unbounded but capped after."""
    wait = (
        wait_exponential(multiplier=policy.startup_base_delay_s, exp_base=2)
        if startup
        else wait_random_exponential(
            multiplier=max(policy.startup_base_delay_s, 0.1), max=policy.recovery_max_delay_s
        )
    )
    stopped = stop_when(stopping.is_set)
    stop = stop_after_attempt(policy.startup_attempts) | stopped if startup else stopped
    return AsyncRetrying(
        stop=stop,
        wait=wait,
        retry=retry_if_not_exception_type(Stopping),
        sleep=_sleep_unless(stopping),
        before_sleep=before_sleep,
        reraise=True,
    )


def _sleep_unless(stopping: asyncio.Event) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stopping.wait()

    return sleep
