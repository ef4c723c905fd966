"""How an MCP server's connection is retried: attempts, backoff, and stopping early.

Start-up makes `[mcp].startup_attempts` attempts with doubling delays; after that a
server is retried for as long as the worker runs, with capped, jittered backoff. Either
way a stopping worker ends the waiting at once (tenacity, with our stop and sleep).

A command that does not exist is retried too: a worker keeps its promise of attempts
and backoff (the server may be installed while it runs). A one-shot run that only looks
(`toolbus mappings`) asks `retry_missing_command=False`: no wait for what cannot start.

The start-up attempts' log lines say what happened in their text, in the words of the
seed operators know ("MCP connection succeeded on attempt 2", "MCP connection failed
after 3 attempts", "degraded mode (local tools only)"), and carry the same data in fields.
The background's attempts after a failed start-up number on from its last (4, 5, ...,
`background` in their fields); a lost session's reconnects count from 1. The final line
shows each attempt's stderr once and a hint from what failed (`hints`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from toolbus.backends.mcp.hints import SEED_HINT
from toolbus.config import McpPolicy
from toolbus.tools.registry import Registry

log = logging.getLogger("toolbus.mcp")


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


def log_connected(server: str, attempt: int) -> None:
    """A start-up or recovery attempt after the first succeeded."""
    log.info(
        "MCP connection succeeded on attempt %d (server %s)",
        attempt,
        server,
        extra={"server": server, "attempt": attempt},
    )


def log_protocol(server: str, version: str | None, listening: bool) -> None:
    """The protocol version a session was opened at: what an operator checks first when a
    server's behaviour differs between versions (a 2026-07-28 one is stateless)."""
    log.info(
        "MCP server %s speaks protocol %s%s",
        server,
        version,
        ", its tool list changes on subscriptions/listen" if listening else "",
        extra={"server": server, "protocol_version": version},
    )


def log_failed_attempt(
    server: str, attempt: int, error: str | None, delay_s: float, *, background: bool = False
) -> None:
    """An attempt failed; the next one comes after `delay_s`. `background`: one of the
    retries after the start-up attempts were spent (numbered on from them)."""
    log.warning(
        "MCP connection attempt %d failed (server %s%s): %s; retrying in %.1f s",
        attempt,
        server,
        ", in the background" if background else "",
        error,
        delay_s,
        extra={
            "server": server,
            "attempt": attempt,
            "background": background,
            "error": error,
            "retry_in_s": round(delay_s, 3),
        },
    )


def log_exhausted(
    server: str,
    attempts: int,
    reason: str,
    stderr_tail: Iterable[str],
    registry: Registry,
    *,
    shown: Iterable[str] | None = None,
    hint: str | None = None,
) -> None:
    """Start-up attempts exhausted: why, the server's stderr (each attempt's lines once,
    `stderr.by_attempt`: the lines, and `shown`, as the text shows them), what to check
    (`hint`, from what failed: `hints`) and what the worker still serves ("local tools
    only" only when that is true)."""
    tail = list(stderr_tail)
    text = tail if shown is None else list(shown)
    hint = hint or SEED_HINT.format(server=server)
    have = registry.names()
    mcp_left = any(tool.server is not None for tool in registry.tools())
    log.error(
        "MCP connection failed after %d %s (server %s): %s. MCP server stderr: %s. "
        "Continuing in degraded mode (%s): %s; retried in the background. Hint: %s",
        attempts,
        "attempt" if attempts == 1 else "attempts",
        server,
        reason,
        " | ".join(text) or "(empty)",
        "local tools and other MCP servers" if mcp_left else "local tools only",
        ", ".join(have) or "no tools",
        hint,
        extra={
            "server": server,
            "attempts": attempts,
            "error": reason,
            "stderr_tail": tail,
            "tools": have,  # what the worker still serves, degraded
            "hint": hint,
        },
    )
