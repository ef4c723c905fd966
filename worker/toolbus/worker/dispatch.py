"""Dispatch: which of a pool's workers answers a message, when the broker does not say.

Behind `$share` (`dispatch = "shared"`) the broker gives each request to one worker.
A broker without shared subscriptions (its CONNACK says Shared Subscription Available 0:
ejabberd, RabbitMQ 3.x, aedes) gives every worker every request: a worker that needs
`$share` refuses such a broker at its first connect (`needs_shares`), before any
`$share/` SUBSCRIBE (which ejabberd answers by closing the session), with the fix in the
error. With `dispatch = "store"` every worker takes every request and asks the shared
store whether it is its own to answer (`Dispatch`, dedup/redis_dispatch.py); the rest
are acknowledged and dropped, nothing published (`gated`). A worker whose broker
connection is lost says so (`offline`): the others then take over what it took.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, Self

from toolbus.transport import BrokerRefused, MqttConnection
from toolbus.wire.broker import BrokerUrl
from toolbus.wire.messages import Inbound, Unconfirmed
from toolbus.wire.topics import Topics

Handle = Callable[[Inbound], Awaitable[Unconfirmed | None]]


class Dispatch(Protocol):
    """Which of the workers that all receive a message answers it."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def mine(self, message: Inbound) -> bool: ...

    def offline(self) -> None:
        """The broker connection is lost: this worker can answer nothing it took."""

    async def online(self) -> None:
        """Connected (again), before any message is taken."""


class NoSharedSubscriptions(BrokerRefused):
    """The broker has no `$share` (CONNACK Shared Subscription Available 0)."""


def needs_shares(conn: MqttConnection, broker: BrokerUrl, topics: Topics) -> None:
    """Refuse a broker without shared subscriptions when the worker's requests arrive on
    them: every worker would run every call."""
    if topics.shared_group and not conn.shared_subscriptions:
        raise NoSharedSubscriptions(
            f"{broker.host} has no shared subscriptions (CONNACK): every worker would run "
            'every call; set dispatch = "store" (with a Redis dedup_store) to share them '
            "through the store"
        )


def gated(dispatch: Dispatch | None, handle: Handle) -> Handle:
    """`handle`, for the messages that are this worker's to answer: another worker took
    the rest (store dispatch), each acknowledged and dropped, nothing published."""
    if dispatch is None:
        return handle

    async def dispatched(message: Inbound) -> Unconfirmed | None:
        if not await dispatch.mine(message):
            return None
        return await handle(message)

    return dispatched
