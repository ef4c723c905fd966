"""How an MCP server's connection is retried: attempts, backoff, and stopping early.

Start-up makes `[mcp].startup_attempts` attempts with doubling delays; after that a
server is retried for as long as the worker runs, with capped, jittered backoff. Either
way a stopping worker ends the waiting at once (tenacity, with our stop and sleep).

A command that does not exist is retried too: a worker keeps its promise of attempts
and backoff (the server may be installed while it runs). A one-shot run that only looks
(`toolbus mappings`) asks `retry_missing_command=False`: no wait for what cannot start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
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
    retry_missing_command: bool = True,
) -> AsyncRetrying:
    """The attempts to (re)connect: bounded at start-up, unbounded but capped after.
    Without `retry_missing_command`, a start-up whose command does not exist ends at its
    first failure (the later, background attempts keep their backoff)."""
    wait = (
        wait_exponential(multiplier=policy.startup_base_delay_s, exp_base=2)
        if startup
        else wait_random_exponential(
            multiplier=max(policy.startup_base_delay_s, 0.1), max=policy.recovery_max_delay_s
        )
    )
    stopped = stop_when(stopping.is_set)
    stop = stop_after_attempt(policy.startup_attempts) | stopped if startup else stopped
    give_up_missing = startup and not retry_missing_command

    def worth_retrying(exc: BaseException) -> bool:
        return not isinstance(exc, Stopping) and not (give_up_missing and missing_command(exc))

    return AsyncRetrying(
        stop=stop,
        wait=wait,
        retry=retry_if_exception(worth_retrying),
        sleep=_sleep_unless(stopping),
        before_sleep=before_sleep,
        reraise=True,
    )


def missing_command(exc: BaseException) -> bool:
    """The server's command (or its working directory) does not exist: ENOENT at spawn."""
    if isinstance(exc, BaseExceptionGroup):
        return any(missing_command(inner) for inner in exc.exceptions)
    return isinstance(exc, FileNotFoundError)


def _sleep_unless(stopping: asyncio.Event) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stopping.wait()

    return sleep
