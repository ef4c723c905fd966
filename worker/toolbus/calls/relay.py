"""Relay: messages between the workers sharing a store, each to one worker by name.

What a continuation needs when it reaches another worker than the one holding its
call (calls/routing.py). The pool's shared store carries them (dedup/redis_relay.py:
Redis pub/sub); a worker alone has none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class Relay(Protocol):
    """Messages between the workers sharing a store, each to one worker by its owner
    name (`TokenStore.owner`)."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def serve(self, handler: Handler) -> None:
        """Answer the messages sent to this worker with `handler`."""

    async def ask(
        self, owner: str, message: dict[str, Any], within_s: float
    ) -> dict[str, Any] | None:
        """`owner`'s answer to `message`, or None when `owner` is gone (nobody listens
        for it, now or while waiting) or did not answer within `within_s`."""
